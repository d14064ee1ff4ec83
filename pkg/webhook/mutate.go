package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tessera-dev/tessera/pkg/fraction"
	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// MutatePath is where the API server sends ResourceClaims to mutate.
const MutatePath = "/mutate"

// GPUModelReader returns the GPU models the cluster publishes now.
type GPUModelReader interface {
	Models(ctx context.Context) ([]fraction.Model, error)
}

// GPUModels reads the GPU models of the cluster's Tessera ResourceSlices
// (fraction.Models): from an informer's cache once it has synced, before that
// with a LIST bounded by Timeout. It needs list and watch on
// resourceslices.resource.k8s.io.
type GPUModels struct {
	client  kubernetes.Interface
	factory informers.SharedInformerFactory
	lister  resourcelisters.ResourceSliceLister
	synced  cache.InformerSynced
	// Timeout bounds the LIST before the cache has synced; zero means
	// DefaultClassTimeout.
	Timeout time.Duration
}

var _ GPUModelReader = (*GPUModels)(nil)

// sliceDriverSelector restricts the informer to Tessera's slices.
var sliceDriverSelector = fields.OneTermEqualSelector("spec.driver", modelnames.DriverName).String()

// NewGPUModels returns a reader over client's ResourceSlices of Tessera.
func NewGPUModels(client kubernetes.Interface) *GPUModels {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = sliceDriverSelector }))
	informer := factory.Resource().V1().ResourceSlices()
	return &GPUModels{client: client, factory: factory, lister: informer.Lister(), synced: informer.Informer().HasSynced}
}

// Start starts the informer; it runs until ctx is done.
func (g *GPUModels) Start(ctx context.Context) { g.factory.Start(ctx.Done()) }

// Models returns the GPU models the cluster's slices publish now.
func (g *GPUModels) Models(ctx context.Context) ([]fraction.Model, error) {
	if g.synced() {
		cached, err := g.lister.List(labels.Everything())
		if err != nil {
			return nil, err
		}
		slices := make([]resourceapi.ResourceSlice, len(cached))
		for i, s := range cached {
			slices[i] = *s
		}
		return fraction.Models(slices), nil
	}
	timeout := g.Timeout
	if timeout <= 0 {
		timeout = DefaultClassTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	list, err := g.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sliceDriverSelector})
	if err != nil {
		return nil, err
	}
	return fraction.Models(list.Items), nil
}

// MutateHandler serves AdmissionReview v1 requests with [Mutate]'s answer.
type MutateHandler struct {
	Models GPUModelReader
}

func (h MutateHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	serveReview(w, r, h.review)
}

func (h MutateHandler) review(w http.ResponseWriter, r *http.Request, review *admissionv1.AdmissionReview) {
	answer(w, r, review, func(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		resp := Mutate(req, func() ([]fraction.Model, error) { return h.Models.Models(ctx) })
		logDenied(ctx, req, resp)
		return resp
	})
}

// Mutate expands a ResourceClaim created with the fraction.Annotation: each
// of its requests for one device of class shared.gpu.tessera.dev without
// capacity requests becomes a firstAvailable list with one subrequest per GPU
// model the cluster publishes now (fraction.Request), keeping the request's
// name, selectors and tolerations, so the claim gets that fraction of
// whichever model it lands on. A request for one device of class
// mig.gpu.tessera.dev becomes one subrequest per GPU model whose MIG profile
// table Tessera knows, for the smallest profile whose compute and memory
// cover the fraction (fraction.MIGRequest). Only v1 CREATE of ResourceClaims is mutated
// (the webhook configuration asks the API server for v1). A bad annotation,
// a share request that sets capacity, count or admin access, a claim without
// such a request, or a cluster without models is refused with the reason.
func Mutate(req *admissionv1.AdmissionRequest, models func() ([]fraction.Model, error)) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Kind.Group != ResourceGroup || req.Kind.Version != "v1" || req.Kind.Kind != "ResourceClaim" || req.Operation != admissionv1.Create {
		return resp
	}
	// Before the object is decoded (see checkShape).
	if denied := shapeDenial(req); denied != nil {
		return denied
	}
	var claim resourceapi.ResourceClaim
	if err := json.Unmarshal(req.Object.Raw, &claim); err != nil {
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: 400, Reason: metav1.StatusReasonBadRequest,
			Message: fmt.Sprintf("ResourceClaim %s: cannot read the object: %v", objectName(req), err)}
		return resp
	}
	value, ok := claim.Annotations[fraction.Annotation]
	if !ok {
		return resp
	}
	// Mutation runs before the API server validates the object: hold it to
	// the API's sizes before expanding anything.
	if errs := checkLimits(&claim.Spec.Devices, field.NewPath("spec", "devices")); len(errs) > 0 {
		resp.Allowed = false
		resp.Result = denial(req, errs)
		return resp
	}
	requests, errs := expandFraction(value, claim.Spec.Devices.Requests, models)
	if len(errs) > 0 {
		resp.Allowed = false
		resp.Result = denial(req, errs)
		return resp
	}
	patch, err := json.Marshal([]map[string]any{{"op": "replace", "path": "/spec/devices/requests", "value": requests}})
	if err != nil {
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: 500, Message: fmt.Sprintf("encode the patch: %v", err)}
		return resp
	}
	pt := admissionv1.PatchTypeJSONPatch
	resp.Patch, resp.PatchType = patch, &pt
	return resp
}

func expandFraction(value string, requests []resourceapi.DeviceRequest, models func() ([]fraction.Model, error)) ([]resourceapi.DeviceRequest, field.ErrorList) {
	annotation := field.NewPath("metadata", "annotations").Key(fraction.Annotation)
	root := field.NewPath("spec", "devices", "requests")
	f, err := fraction.Parse(value)
	if err != nil {
		return nil, field.ErrorList{field.Invalid(annotation, value, err.Error())}
	}
	var errs field.ErrorList
	out := make([]resourceapi.DeviceRequest, len(requests))
	expanded := 0
	var known []fraction.Model
	for i, r := range requests {
		out[i] = r
		e := r.Exactly
		if e == nil || (e.DeviceClassName != modelnames.SharedClassName && e.DeviceClassName != modelnames.MIGClassName) {
			continue
		}
		mig := e.DeviceClassName == modelnames.MIGClassName
		what := "a share"
		if mig {
			what = "a MIG device"
		}
		path := root.Index(i).Child("exactly")
		if e.Capacity != nil && len(e.Capacity.Requests) > 0 {
			errs = append(errs, field.Invalid(path.Child("capacity", "requests"), "", fmt.Sprintf("the %s annotation sets the share's memory and cores: drop capacity.requests or the annotation", fraction.Annotation)))
			continue
		}
		if e.AdminAccess != nil && *e.AdminAccess {
			errs = append(errs, field.Invalid(path.Child("adminAccess"), true, fmt.Sprintf("the %s annotation asks for %s; admin access takes none", fraction.Annotation, what)))
			continue
		}
		if e.AllocationMode == resourceapi.DeviceAllocationModeAll || e.Count > 1 {
			errs = append(errs, field.Invalid(path.Child("count"), e.Count, fmt.Sprintf("the %s annotation asks for %s of one GPU: count must be 1", fraction.Annotation, what)))
			continue
		}
		var fr resourceapi.DeviceRequest
		if mig {
			// The profile tables are built in: no read of the cluster.
			fr, err = fraction.MIGRequest(r.Name, f, fraction.MIGModels())
		} else {
			if known == nil {
				if known, err = models(); err != nil {
					return nil, field.ErrorList{field.InternalError(annotation, fmt.Errorf("read the GPU models the cluster publishes: %w", err))}
				}
			}
			fr, err = fraction.Request(r.Name, f, known)
		}
		if err != nil {
			return nil, field.ErrorList{field.Invalid(annotation, value, err.Error())}
		}
		for j := range fr.FirstAvailable {
			s := &fr.FirstAvailable[j]
			s.Selectors = append(s.Selectors, e.Selectors...)
			s.Tolerations = e.Tolerations
		}
		out[i] = fr
		expanded++
	}
	if len(errs) == 0 && expanded == 0 {
		errs = append(errs, field.Invalid(annotation, value, fmt.Sprintf("no request of the claim asks for exactly one device of class %s or %s to apply the fraction to", modelnames.SharedClassName, modelnames.MIGClassName)))
	}
	return out, errs
}
