package webhook

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// worstClaim is a ResourceClaim review that makes every check of Review do
// the most work it can per field: requests of shares, each with subs
// firstAvailable alternatives (subs 0: exact requests), isolation MPS so
// that the one-GPU checks compare every pair, configs that each name every
// request and carry paramBytes of parameters (padded with blanks, which
// the decoder must read), and constraints that each name every request.
func worstClaim(requests, subs, configs, constraints, paramBytes int) *admissionv1.AdmissionRequest {
	names := make([]string, requests)
	reqs := make([]map[string]any, requests)
	for i := range requests {
		names[i] = fmt.Sprintf("r%d", i)
		share := map[string]any{
			"deviceClassName": modelnames.SharedClassName, "count": 1,
			"capacity": map[string]any{"requests": map[string]string{"memory": "10Gi", "cores": "10"}},
		}
		if subs == 0 {
			reqs[i] = map[string]any{"name": names[i], "exactly": share}
			continue
		}
		alternatives := make([]map[string]any, subs)
		for j := range subs {
			alt := map[string]any{"name": fmt.Sprintf("s%d", j)}
			for k, v := range share {
				alt[k] = v
			}
			alternatives[j] = alt
		}
		reqs[i] = map[string]any{"name": names[i], "firstAvailable": alternatives}
	}
	params := `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"isolation":"MPS","computeLimit":50}}`
	// json.Marshal compacts a RawMessage: the blanks go in afterwards.
	padded := params
	if pad := paramBytes - len(params); pad > 0 {
		padded = params[:len(params)-1] + strings.Repeat(" ", pad) + "}"
	}
	cfgs := make([]map[string]any, configs)
	for i := range configs {
		cfgs[i] = map[string]any{"requests": names, "opaque": map[string]any{"driver": modelnames.DriverName, "parameters": json.RawMessage(params)}}
	}
	cons := make([]map[string]any, constraints)
	for i := range constraints {
		cons[i] = map[string]any{"requests": names, "matchAttribute": string(modelnames.UUIDAttribute)}
	}
	claim := map[string]any{
		"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
		"metadata": map[string]any{"name": "worst", "namespace": "team-a"},
		"spec":     map[string]any{"devices": map[string]any{"requests": reqs, "config": cfgs, "constraints": cons}},
	}
	raw, err := json.Marshal(claim)
	if err != nil {
		panic(err)
	}
	raw = bytes.ReplaceAll(raw, []byte(params), []byte(padded))
	return &admissionv1.AdmissionRequest{
		UID:       "worst",
		Kind:      metav1.GroupVersionKind{Group: ResourceGroup, Version: "v1", Kind: "ResourceClaim"},
		Name:      "worst",
		Namespace: "team-a",
		Operation: admissionv1.Create,
		Object:    runtime.RawExtension{Raw: raw},
	}
}
