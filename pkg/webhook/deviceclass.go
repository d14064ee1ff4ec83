package webhook

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// wireDeviceClass is a DeviceClass reduced to its opaque configs; the field
// names are the same in v1, v1beta2 and v1beta1.
type wireDeviceClass struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Selectors []struct {
			CEL *struct {
				Expression string `json:"expression"`
			} `json:"cel"`
		} `json:"selectors"`
		Config []struct {
			Opaque *struct {
				Driver     string          `json:"driver"`
				Parameters json.RawMessage `json:"parameters"`
			} `json:"opaque"`
		} `json:"config"`
	} `json:"spec"`
}

// reviewDeviceClass checks each gpu.tessera.dev opaque config of a created or
// updated DeviceClass with the class rules: it must decode strictly and pass
// GpuConfig.Validate, which accepts sharing.allowedIsolations (a claim may not
// set it; a class may). A class that selects MIG devices (selectsMIG) may not
// set sharing.isolation HAMiCore or DriverMemory, nor lend
// (migClassConfigErrors). Prepare decodes the class config again and fails a
// claim whose class config is bad; this only says so when the class is written.
func reviewDeviceClass(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return resp
	}
	if len(req.Object.Raw) == 0 {
		return badRequest(req, fmt.Errorf("the request has no object"))
	}
	if denied := shapeDenial(req); denied != nil {
		return denied
	}
	var class wireDeviceClass
	if err := json.Unmarshal(req.Object.Raw, &class); err != nil {
		return badRequest(req, err)
	}
	configs := field.NewPath("spec", "config")
	if n := len(class.Spec.Config); n > maxConfigs {
		resp.Allowed = false
		resp.Result = denial(req, field.ErrorList{field.TooMany(configs, n, maxConfigs)})
		return resp
	}
	selectors := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: class.Metadata.Name}}
	for _, sel := range class.Spec.Selectors {
		if sel.CEL != nil {
			selectors.Spec.Selectors = append(selectors.Spec.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: sel.CEL.Expression}})
		}
	}
	mig := selectsMIG(selectors)
	var errs field.ErrorList
	var floor classConsistency
	for i, entry := range class.Spec.Config {
		if entry.Opaque == nil || entry.Opaque.Driver != configapi.GroupName {
			continue
		}
		path := configs.Index(i).Child("opaque", "parameters")
		if tooLong := checkParameters(path, len(entry.Opaque.Parameters)); len(tooLong) > 0 {
			errs = append(errs, tooLong...)
			continue
		}
		cfg, err := configapi.DecodeStrict(entry.Opaque.Parameters)
		if err != nil {
			errs = append(errs, field.Invalid(path, "", err.Error()))
			continue
		}
		valid := cfg.Validate()
		for _, e := range valid {
			rooted := *e
			rooted.Field = path.String() + "." + e.Field
			errs = append(errs, &rooted)
		}
		if mig && len(valid) == 0 {
			errs = append(errs, migClassConfigErrors(class.Metadata.Name, path, cfg)...)
		}
		if len(valid) == 0 {
			errs = append(errs, floor.add(path, cfg)...)
		}
	}
	errs = append(errs, floor.check()...)
	if len(errs) > 0 {
		resp.Allowed = false
		resp.Result = denial(req, errs)
	}
	return resp
}

// classConsistency follows the sharing settings of a class's configs in
// order, as prepare merges them (configapi.ConfigForRequest), to refuse a
// class whose configs contradict each other or themselves: every share of
// it would be refused at prepare, or its sharing.isolation, the default of
// its shares, never allowed.
type classConsistency struct {
	// allowed holds the isolations every config so far allows (nil: no
	// config sets sharing.allowedIsolations); allowedAt names them.
	allowed   []configapi.Isolation
	allowedAt []string
	// isolation is the last sharing.isolation set, at isolationPath.
	isolation     configapi.Isolation
	isolationPath *field.Path
}

// add takes the next valid config of the class, at path (its
// opaque.parameters), and refuses an allowedIsolations that leaves no
// isolation in common with the earlier configs'.
func (f *classConsistency) add(path *field.Path, cfg *configapi.GpuConfig) field.ErrorList {
	if cfg.Sharing == nil {
		return nil
	}
	if cfg.Sharing.Isolation != "" {
		f.isolation, f.isolationPath = cfg.Sharing.Isolation, path.Child("sharing", "isolation")
	}
	allowed := cfg.Sharing.AllowedIsolations
	if allowed == nil {
		return nil
	}
	at := path.Child("sharing", "allowedIsolations")
	if f.allowed == nil {
		f.allowed, f.allowedAt = slices.Clone(allowed), []string{at.String()}
		return nil
	}
	common := slices.DeleteFunc(slices.Clone(f.allowed), func(i configapi.Isolation) bool { return !slices.Contains(allowed, i) })
	if len(common) == 0 {
		return field.ErrorList{field.Invalid(at, configapi.FormatIsolations(allowed), fmt.Sprintf(
			"has no isolation in common with %s (%s): a share must have an isolation every one of them allows, so prepare would refuse every share of the class",
			strings.Join(f.allowedAt, ", "), configapi.FormatIsolations(f.allowed)))}
	}
	f.allowed, f.allowedAt = common, append(f.allowedAt, at.String())
	return nil
}

// check refuses a class whose sharing.isolation (the last one set) is not
// among the isolations its configs allow: prepare refuses every share of
// the class that does not choose another isolation itself.
func (f *classConsistency) check() field.ErrorList {
	if f.isolation == "" || f.allowed == nil || slices.Contains(f.allowed, f.isolation) {
		return nil
	}
	return field.ErrorList{field.Invalid(f.isolationPath, string(f.isolation), fmt.Sprintf(
		"is not among the isolations the class allows (%s, sharing.allowedIsolations at %s): prepare would refuse every share of the class "+
			"that does not set another isolation itself; set sharing.isolation to one of them",
		configapi.FormatIsolations(f.allowed), strings.Join(f.allowedAt, ", ")))}
}
