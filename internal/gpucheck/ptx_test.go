package gpucheck

import (
	"strings"
	"testing"
)

// TestSpinPTX: the embedded kernel parses, has the entry the probe launches,
// and takes exactly the (u64 counter, u64 cycles) that cuda.Lib.LaunchSpin
// passes; a mismatch would make the driver read garbage.
func TestSpinPTX(t *testing.T) {
	m, err := ParsePTX(SpinPTX)
	if err != nil {
		t.Fatalf("ParsePTX(spin.ptx): %v", err)
	}
	if m.Version != "7.0" || m.Target != "sm_70" || m.AddressSize != 64 {
		t.Errorf("header = %s %s %d, want 7.0 sm_70 64", m.Version, m.Target, m.AddressSize)
	}
	e, ok := m.Entry(SpinEntry)
	if !ok {
		t.Fatalf("no entry %s in %+v", SpinEntry, m.Entries)
	}
	if len(e.Params) != 2 || e.Params[0].Type != "u64" || e.Params[1].Type != "u64" {
		t.Errorf("params = %+v, want two .u64 (counter, cycles)", e.Params)
	}
	if e.Instructions < 10 {
		t.Errorf("%d instructions: the spin loop and the counter update are missing", e.Instructions)
	}
	w, ok := m.Entry(WorkEntry)
	if !ok {
		t.Fatalf("no entry %s in %+v", WorkEntry, m.Entries)
	}
	if len(w.Params) != 2 || w.Params[0].Type != "u64" || w.Params[1].Type != "u64" {
		t.Errorf("%s params = %+v, want two .u64 (counter, iterations)", WorkEntry, w.Params)
	}
	if w.Instructions < 12 {
		t.Errorf("%s: %d instructions: the loop, the result's use or the counter update are missing", WorkEntry, w.Instructions)
	}
}

// TestParsePTXRejects: each kind of mistake the check knows is refused with
// an error naming the line or the thing that is wrong.
func TestParsePTXRejects(t *testing.T) {
	for name, tc := range map[string]struct {
		old, new string // replace old by new in spin.ptx
		want     string
	}{
		"no version":          {".version 7.0\n", "", "want .version"},
		"bad version":         {".version 7.0", ".version seven", `.version "seven"`},
		"bad target":          {".target sm_70", ".target compute", `.target "compute"`},
		"bad address size":    {".address_size 64", ".address_size 48", "want 32 or 64"},
		"undeclared register": {"sub.s64 \t%rd5, %rd4, %rd3", "sub.s64 \t%rd5, %rd4, %rd9", "register %rd9 is not declared"},
		"register range end":  {".reg .b64 \t%rd<8>", ".reg .b64 \t%rd<7>", "register %rd7 is not declared"},
		"undeclared guard":    {"@%p1 bra", "@%q1 bra", "guard predicate %q1"},
		"missing label":       {"@%p2 bra \t$L_done", "@%p2 bra \t$L_gone", `branch to "$L_gone"`},
		"unknown opcode":      {"sub.s64", "subtract.s64", "unknown instruction"},
		"unknown parameter":   {"[tessera_spin_cycles]", "[tessera_spin_cycle]", `reads "tessera_spin_cycle"`},
		"bad parameter":       {".param .u64 tessera_spin_cycles", ".param tessera_spin_cycles", "want `.param .TYPE NAME`"},
		"unterminated":        {"ret;", "ret", "not terminated by ';'"},
		"no return":           {"ret;", "mov.u32 %r1, 0;", "never returns"},
		"unclosed body":       {"ret;\n}", "ret;\n", "no closing brace"},
		"not an entry":        {".visible .entry tessera_spin(", ".visible .func tessera_spin(", "want `.visible .entry NAME"},
		"directive in body":   {".reg .pred", ".shared .pred", "unsupported directive"},
	} {
		t.Run(name, func(t *testing.T) {
			if !strings.Contains(SpinPTX, tc.old) {
				t.Fatalf("spin.ptx has no %q to replace", tc.old)
			}
			src := strings.Replace(SpinPTX, tc.old, tc.new, 1)
			_, err := ParsePTX(src)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ParsePTX = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestParsePTXLineNumbers: errors point at the line in the file as written,
// comments included.
func TestParsePTXLineNumbers(t *testing.T) {
	src := "// one\n/* two\n three */\n.version 7.0\n.target sm_70\n.address_size 64\n.visible .entry k()\n{\n\tfoo.u32 %r1;\n\tret;\n}\n"
	_, err := ParsePTX(src)
	if err == nil || !strings.Contains(err.Error(), "ptx line 9:") {
		t.Fatalf("ParsePTX = %v, want an error on line 9", err)
	}
}
