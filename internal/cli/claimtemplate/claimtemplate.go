// Package claimtemplate builds the ResourceClaimTemplates users would otherwise
// write by hand: whole GPUs, shares or MIG devices, NVLink required or
// preferred (firstAvailable with a constrained subrequest first), and the
// GpuConfig for the node.
//
// Build is pure: it returns the object or an error saying which option is wrong.
// It checks what it built with webhook.ValidateDeviceClaim, the check of the
// admission webhook, so it never prints a template the webhook refuses.
package claimtemplate

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/fraction"
	"github.com/tessera-dev/tessera/pkg/model"
	"github.com/tessera-dev/tessera/pkg/webhook"
)

// RequestName is the name of the single request in every generated template;
// containers refer to the claim, not the request, so one name is enough.
const RequestName = "gpu"

// NVLink is what a multi-GPU template asks of NVLink.
type NVLink string

const (
	// NVLinkNone puts no NVLink constraint on the GPUs.
	NVLinkNone NVLink = ""
	// NVLinkPrefer tries an NVLink-connected set first and falls back to any GPUs.
	NVLinkPrefer NVLink = "prefer"
	// NVLinkRequire allocates only an NVLink-connected set.
	NVLinkRequire NVLink = "require"
)

// Options describe the template. The zero value (plus a Name) is one whole GPU.
type Options struct {
	Name      string
	Namespace string
	// GPUs is the number of GPUs (whole) or of shares on distinct GPUs; 0 means 1.
	GPUs int
	// Memory and Cores, when either is set, make the request a share of each GPU.
	Memory string
	Cores  int
	// NVLink policy for GPUs > 1.
	NVLink NVLink
	// Isolation backend for shares: Advisory, MPS or HAMiCore; empty leaves the default.
	Isolation string
	// ComputeLimit caps a share's compute above its guaranteed Cores (percent).
	ComputeLimit int
	// Fraction, instead of Memory and Cores, makes the request a share of
	// this fraction of whichever GPU model it lands on ("1/4", "0.5"), one
	// firstAvailable subrequest per model in Models.
	Fraction string
	// Models are the GPU models a Fraction is computed for (fraction.Models
	// of the cluster's or a profile's ResourceSlices).
	Models []fraction.Model
	// MIG asks for MIG devices (class mig.gpu.tessera.dev): of MIGProfile
	// when set ("3g.40gb"), else, with a Fraction, of each known GPU model's
	// smallest profile that covers it (fraction.MIGRequest), else of any
	// profile (the smallest free instance: devices are published small
	// first).
	MIG        bool
	MIGProfile string
}

// Build returns the ResourceClaimTemplate for opts, with warnings about what it
// asks for that users rarely mean (a share without --memory is allocated all of
// its GPU's memory).
//
// It refuses options it cannot turn into a template, naming the flag, and then
// options whose template the admission webhook would refuse because the kubelet
// plugin would refuse to prepare its claims (webhook.ValidateDeviceClaim): for
// example --compute-limit below --cores, --isolation MPS with --gpus 2 (an
// MPS claim is exactly one share), or --mig with --isolation HAMiCore (MIG
// is the isolation).
func Build(opts Options) (*resourceapi.ResourceClaimTemplate, []string, error) {
	var errs []error
	if msgs := validation.IsDNS1123Subdomain(opts.Name); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--name %q: %s", opts.Name, strings.Join(msgs, "; ")))
	}
	gpus := opts.GPUs
	if gpus == 0 {
		gpus = 1
	}
	if gpus < 0 || gpus > resourceapi.AllocationResultsMaxSize {
		errs = append(errs, fmt.Errorf("--gpus %d: must be between 1 and %d", opts.GPUs, resourceapi.AllocationResultsMaxSize))
	}
	shared := !opts.MIG && (opts.Memory != "" || opts.Cores != 0 || opts.Fraction != "")
	var warnings []string
	if opts.MIG {
		switch {
		case opts.Memory != "" || opts.Cores != 0:
			errs = append(errs, errors.New("--memory and --cores size a share; a MIG device has its profile's: name one with --mig PROFILE, or use --fraction"))
		case opts.NVLink != NVLinkNone:
			errs = append(errs, errors.New("--nvlink: MIG devices have no NVLink (no peer-to-peer between instances)"))
		case opts.ComputeLimit != 0:
			errs = append(errs, errors.New("--compute-limit caps a share; a MIG device's compute is its profile's"))
		case opts.MIGProfile != "" && opts.Fraction != "":
			errs = append(errs, fmt.Errorf("--mig %s and --fraction both choose the profile: drop one", opts.MIGProfile))
		}
		if opts.MIGProfile != "" {
			if err := fraction.CheckMIGProfile(opts.MIGProfile); err != nil {
				errs = append(errs, fmt.Errorf("--mig: %w", err))
			} else if len(fraction.KnownMIGProfile(opts.MIGProfile)) == 0 {
				warnings = append(warnings, fmt.Sprintf("MIG profile %s is in none of the MIG tables Tessera knows (%s): the claim gets a device only where a GPU publishes that profile",
					opts.MIGProfile, knownMIGProducts()))
			}
		}
	}
	var frac fraction.Fraction
	if opts.Fraction != "" {
		f, err := fraction.Parse(opts.Fraction)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("--fraction: %w", err))
		case opts.Memory != "" || opts.Cores != 0:
			if !opts.MIG {
				errs = append(errs, errors.New("--fraction sets the share's memory and cores: drop --memory and --cores"))
			}
		case gpus != 1 || opts.NVLink != NVLinkNone:
			errs = append(errs, errors.New("--fraction is a share of one GPU: drop --gpus and --nvlink"))
		default:
			frac = f
		}
	}
	var memory resource.Quantity
	if opts.Memory != "" {
		q, err := resource.ParseQuantity(opts.Memory)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("--memory %q: not a quantity (for example 10Gi or 512Mi)", opts.Memory))
		case q.Sign() <= 0:
			errs = append(errs, fmt.Errorf("--memory %q: must be positive", opts.Memory))
		default:
			memory = q
		}
	}
	if opts.Cores < 0 || opts.Cores > 100 {
		errs = append(errs, fmt.Errorf("--cores %d: must be between 0 and 100 (percent of the GPU)", opts.Cores))
	}
	switch opts.NVLink {
	case NVLinkNone, NVLinkPrefer, NVLinkRequire:
	default:
		errs = append(errs, fmt.Errorf("--nvlink %q: must be prefer or require", opts.NVLink))
	}
	if opts.NVLink != NVLinkNone && gpus < 2 {
		errs = append(errs, fmt.Errorf("--nvlink %s: needs --gpus 2 or more", opts.NVLink))
	}
	if !shared && !opts.MIG && (opts.Isolation != "" || opts.ComputeLimit != 0) {
		errs = append(errs, errors.New("--isolation and --compute-limit apply to shares: add --memory and/or --cores"))
	}
	var fractionRequest resourceapi.DeviceRequest
	switch {
	case frac.Den != 0 && opts.MIG:
		req, err := fraction.MIGRequest(RequestName, frac, fraction.MIGModels())
		if err != nil {
			errs = append(errs, fmt.Errorf("--mig --fraction %s: %w", frac, err))
		}
		fractionRequest = req
	case frac.Den != 0:
		req, err := fraction.Request(RequestName, frac, opts.Models)
		if err != nil {
			errs = append(errs, fmt.Errorf("--fraction %s: %w", frac, err))
		}
		fractionRequest = req
	}
	if len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}

	cfg := &configapi.GpuConfig{TypeMeta: metav1.TypeMeta{APIVersion: configapi.SchemeGroupVersion.String(), Kind: configapi.GpuConfigKind}}
	if opts.Isolation != "" || opts.ComputeLimit != 0 {
		cfg.Sharing = &configapi.SharingConfig{Isolation: configapi.Isolation(opts.Isolation)}
		if opts.ComputeLimit != 0 {
			limit := int32(opts.ComputeLimit)
			cfg.Sharing.ComputeLimit = &limit
		}
	}
	switch opts.NVLink {
	case NVLinkRequire:
		cfg.Topology = &configapi.TopologyConfig{NVLink: configapi.NVLinkRequired}
	case NVLinkPrefer:
		cfg.Topology = &configapi.TopologyConfig{NVLink: configapi.NVLinkPreferred}
	}

	class := model.WholeClassName
	if opts.MIG {
		class = model.MIGClassName
	}
	var capacity *resourceapi.CapacityRequirements
	if shared {
		class = model.SharedClassName
		capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
		if opts.Memory != "" {
			capacity.Requests["memory"] = memory
		}
		if opts.Cores != 0 {
			capacity.Requests["cores"] = *resource.NewQuantity(int64(opts.Cores), resource.DecimalSI)
		}
	}
	sub := func(name string) resourceapi.DeviceSubRequest {
		return resourceapi.DeviceSubRequest{Name: name, DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(gpus), Capacity: capacity}
	}

	devices := resourceapi.DeviceClaim{}
	nvlinkDomain := resourceapi.FullyQualifiedName(model.DriverName + "/" + string(model.AttrNVLinkDomain))
	uuid := resourceapi.FullyQualifiedName(model.DriverName + "/" + string(model.AttrUUID))
	switch {
	case frac.Den != 0:
		devices.Requests = []resourceapi.DeviceRequest{fractionRequest}
	case opts.NVLink == NVLinkPrefer:
		devices.Requests = []resourceapi.DeviceRequest{{Name: RequestName, FirstAvailable: []resourceapi.DeviceSubRequest{sub("nvlink"), sub("any")}}}
		devices.Constraints = []resourceapi.DeviceConstraint{{Requests: []string{RequestName + "/nvlink"}, MatchAttribute: &nvlinkDomain}}
	default:
		s := sub("")
		devices.Requests = []resourceapi.DeviceRequest{{Name: RequestName, Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: s.DeviceClassName, AllocationMode: s.AllocationMode, Count: s.Count, Capacity: s.Capacity,
		}}}
		if opts.MIGProfile != "" {
			devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: fraction.MIGProfileSelector(opts.MIGProfile),
			}}}
		}
		if opts.NVLink == NVLinkRequire {
			devices.Constraints = []resourceapi.DeviceConstraint{{Requests: []string{RequestName}, MatchAttribute: &nvlinkDomain}}
		}
	}
	// Several shares in one claim must sit on distinct GPUs: two shares of the same
	// GPU are one bigger share, not more GPUs.
	if shared && gpus > 1 {
		devices.Constraints = append(devices.Constraints, resourceapi.DeviceConstraint{Requests: []string{RequestName}, DistinctAttribute: &uuid})
	}
	if cfg.Sharing != nil || cfg.Topology != nil {
		raw, err := json.Marshal(cfg)
		if err != nil {
			return nil, nil, fmt.Errorf("encode GpuConfig: %w", err)
		}
		devices.Config = []resourceapi.DeviceClaimConfiguration{{
			Requests: []string{RequestName},
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: model.DriverName, Parameters: runtime.RawExtension{Raw: raw},
			}},
		}}
	}

	problems, checked := webhook.ValidateDeviceClaim(&devices, field.NewPath("spec", "spec", "devices"))
	warnings = append(warnings, checked...)
	if len(problems) > 0 {
		for _, p := range problems {
			msg := p.Error()
			if p.Type == field.ErrorTypeInvalid && p.BadValue == "" {
				msg = p.Field + ": " + p.Detail
			}
			errs = append(errs, errors.New(msg))
		}
		return nil, nil, fmt.Errorf("the admission webhook would refuse this template: %w", errors.Join(errs...))
	}
	return &resourceapi.ResourceClaimTemplate{
		TypeMeta:   metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceClaimTemplate"},
		ObjectMeta: metav1.ObjectMeta{Name: opts.Name, Namespace: opts.Namespace},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: devices}},
	}, warnings, nil
}

// knownMIGProducts lists the first product of each known MIG model.
func knownMIGProducts() string {
	var names []string
	for _, m := range fraction.MIGModels() {
		names = append(names, m.Products[0])
	}
	return strings.Join(names, ", ")
}
