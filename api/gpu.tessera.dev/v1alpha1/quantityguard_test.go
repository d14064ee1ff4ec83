package v1alpha1

import "testing"

func TestQuantityExponent(t *testing.T) {
	tests := []struct {
		in     string
		want   int64
		wantOK bool
	}{
		{"1e9", 9, true},
		{"-1.5E-3", -3, true},
		{"1e+12", 12, true},
		{"16Gi", 0, false},
		{"1E", 0, false}, // exa
		{"1Ei", 0, false},
		{"1e", 0, false},
		{"1e--3", 0, false},
		{"1e3x", 0, false},
		{"1e99999999999999999999", maxQuantityExponent + 1, true},
		{"1e-99999999999999999999", -maxQuantityExponent - 1, true},
	}
	for _, tc := range tests {
		got, ok := quantityExponent(tc.in)
		if got != tc.want || ok != tc.wantOK {
			t.Errorf("quantityExponent(%q) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.wantOK)
		}
	}
}
