package webhook

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// TestGpuConfigHasOnlyTypedFields proves that a GpuConfig cannot carry
// environment variables, mounts, hooks or host paths: every field a user can
// set is listed here with its type, and each is an enum, a bounded integer or a
// quantity, or a list of an enum. There is no free-form string, map or list
// anywhere in the type, so nothing in a config can become an env name, a path
// or a command on the node.
// Adding a field fails this test on purpose: whoever adds one must show here
// that it keeps that property.
func TestGpuConfigHasOnlyTypedFields(t *testing.T) {
	want := []string{
		"apiVersion string (TypeMeta; must be gpu.tessera.dev/v1alpha1)",
		"kind string (TypeMeta; must be GpuConfig)",
		"lending.lendWhenIdle *bool (a consent; it names nothing)",
		"locality.affinity v1alpha1.LocalityLabel (a label value; only compared)",
		"locality.antiAffinity v1alpha1.LocalityLabel (a label value; only compared)",
		"locality.exclusion v1alpha1.LocalityLabel (a label value; only compared)",
		"locality.scope v1alpha1.LocalityScope (enum)",
		"sharing.allowedIsolations []v1alpha1.Isolation (list of the enum)",
		"sharing.computeLimit *int32",
		"sharing.isolation v1alpha1.Isolation (enum)",
		"sharing.memoryLimit *resource.Quantity",
		"topology.nvlink v1alpha1.NVLinkPolicy (enum)",
	}
	var got []string
	var walk func(prefix string, typ reflect.Type)
	walk = func(prefix string, typ reflect.Type) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if f.Type == reflect.TypeFor[metav1.TypeMeta]() {
				got = append(got,
					"apiVersion string (TypeMeta; must be gpu.tessera.dev/v1alpha1)",
					"kind string (TypeMeta; must be GpuConfig)")
				continue
			}
			if name == "" || name == "-" {
				t.Errorf("%s%s: field without a JSON name", prefix, f.Name)
				continue
			}
			path := prefix + name
			ft := f.Type
			switch {
			case ft == reflect.TypeFor[configapi.Isolation]() || ft == reflect.TypeFor[configapi.NVLinkPolicy]() ||
				ft == reflect.TypeFor[configapi.LocalityScope]():
				got = append(got, path+" "+ft.String()+" (enum)")
			case ft == reflect.TypeFor[[]configapi.Isolation]():
				got = append(got, path+" "+ft.String()+" (list of the enum)")
			case ft == reflect.TypeFor[*int32]() || ft == reflect.TypeFor[*resource.Quantity]():
				got = append(got, path+" "+ft.String())
			case ft == reflect.TypeFor[configapi.LocalityLabel]():
				// Validate limits it to a label value (no '/', '=', space
				// or NUL); only the locality controller reads it, to compare.
				got = append(got, path+" "+ft.String()+" (a label value; only compared)")
			case ft == reflect.TypeFor[*bool]():
				got = append(got, path+" "+ft.String()+" (a consent; it names nothing)")
			case ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct:
				walk(path+".", ft.Elem())
			default:
				t.Errorf("%s: type %s is not an enum, a bounded integer or a quantity; "+
					"a GpuConfig must not carry free-form values (env, mounts, paths)", path, ft)
			}
		}
	}
	walk("", reflect.TypeFor[configapi.GpuConfig]())
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("GpuConfig's fields changed:\n got %q\nwant %q", got, want)
	}
}

// TestEnumsAreClosed checks that the enum fields accept only their listed
// values, so an enum cannot smuggle a path either.
func TestEnumsAreClosed(t *testing.T) {
	for _, value := range []string{"/usr/lib/libvgpu.so", "Advisory;LD_PRELOAD=x", "advisory", ""} {
		iso := configapi.Isolation(value)
		cfg := &configapi.GpuConfig{Sharing: &configapi.SharingConfig{Isolation: iso}, Topology: &configapi.TopologyConfig{NVLink: configapi.NVLinkPolicy(value)}}
		errs := cfg.Validate()
		if value == "" {
			if len(errs) != 0 {
				t.Errorf("empty enums (unset) rejected: %v", errs)
			}
		} else if len(errs) != 2 {
			t.Errorf("%q: want both enums rejected, got %v", value, errs)
		}
		// In a list, an empty value is no isolation either.
		list := &configapi.GpuConfig{Sharing: &configapi.SharingConfig{AllowedIsolations: []configapi.Isolation{configapi.IsolationMPS, iso}}}
		if errs := list.Validate(); len(errs) != 1 {
			t.Errorf("allowedIsolations [MPS, %q]: want the second rejected, got %v", value, errs)
		}
	}
}
