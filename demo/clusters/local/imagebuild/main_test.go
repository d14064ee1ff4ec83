package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseLdd(t *testing.T) {
	for _, tc := range []struct {
		name, out string
		want      []string
	}{
		{
			name: "cgo binary",
			out: "\tlinux-vdso.so.1 (0x00007ffd)\n" +
				"\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f9d)\n" +
				"\t/lib64/ld-linux-x86-64.so.2 (0x00007f9e)\n",
			want: []string{"/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"},
		},
		{name: "static", out: "\tnot a dynamic executable\n"},
		{name: "missing library is not copied", out: "\tlibfoo.so.1 => not found\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, parseLdd(tc.out)); diff != "" {
				t.Errorf("parseLdd (-want +got):\n%s", diff)
			}
		})
	}
}
