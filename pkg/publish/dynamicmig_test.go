package publish

import (
	"slices"
	"testing"
)

func TestParseDynamicMIG(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want DynamicMIG
		err  bool
	}{
		{in: nil},
		{in: []string{"all"}, want: DynamicMIG{All: true}},
		{in: []string{"0", "GPU-abc"}, want: DynamicMIG{Names: []string{"0", "GPU-abc"}}},
		{in: []string{"all", "1"}, err: true},
		{in: []string{"-1"}, err: true},
		{in: []string{"01"}, err: true},
		{in: []string{"gpu3"}, err: true},
	} {
		got, err := ParseDynamicMIG(tc.in)
		if (err != nil) != tc.err || !tc.err && (got.All != tc.want.All || !slices.Equal(got.Names, tc.want.Names)) {
			t.Errorf("ParseDynamicMIG(%q) = %+v, %v", tc.in, got, err)
		}
	}
}
