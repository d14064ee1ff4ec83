package v1alpha1

import (
	"testing"
)

// FuzzDecodeStrict checks that no input makes the decoders, Validate, Default or
// ShareLimits panic, and that a config DecodeStrict accepts is also accepted by
// DecodeLenient. Run longer with: go test -fuzz FuzzDecodeStrict ./api/...
func FuzzDecodeStrict(f *testing.F) {
	for _, seed := range []string{
		architectureExample,
		header,
		header + "sharing:\n  isolaton: MPS\n",
		header + "sharing:\n  memoryLimit: 1048576500m\n  computeLimit: -5\n",
		`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"isolation":"MPS","isolation":"MPS"}}`,
		`{apiVersion: gpu.tessera.dev/v1alpha1, kind: GpuConfig, topology: {nvlink: Maybe}}`,
		"a: &a [*a, *a]\n",
		header + "sharing:\n  memoryLimit: \"1e999999999\"\n",
		header + "sharing:\n  memoryLimit: \"1e-999\"\n",
		"---\n---\n",
		"null", "[]", "{", "\t", "",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		config, err := DecodeStrict(raw)
		lenient, lenientErr := DecodeLenient(raw)
		if err != nil {
			if config != nil {
				t.Fatalf("DecodeStrict returned both a config and error %v", err)
			}
			return
		}
		if lenientErr != nil || lenient == nil {
			t.Fatalf("DecodeStrict accepted what DecodeLenient rejects: %v", lenientErr)
		}
		_ = config.Validate()
		_, _, _ = config.ShareLimits(1<<30, 25)
		config.Default()
		_, _, _ = config.ShareLimits(0, 0)
	})
}
