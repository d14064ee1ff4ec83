package gpucheck

import (
	_ "embed"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// SpinPTX is the probe's kernel (spin.ptx): entry [SpinEntry] with
// parameters (.u64 counter, .u64 cycles), as cuda.Lib.LaunchSpin passes them.
//
//go:embed spin.ptx
var SpinPTX string

// SpinEntry is the kernel entry in [SpinPTX].
const SpinEntry = "tessera_spin"

// WorkEntry is the fixed-work kernel in [SpinPTX]: parameters (.u64 counter,
// .u64 iterations), counter pointing at two 64-bit words.
const WorkEntry = "tessera_work"

// PTXModule is what [ParsePTX] read from PTX text.
type PTXModule struct {
	Version     string // ".version", e.g. "7.0"
	Target      string // first ".target", e.g. "sm_70"
	AddressSize int    // ".address_size": 32 or 64
	Entries     []PTXEntry
}

// Entry returns the entry named name.
func (m PTXModule) Entry(name string) (PTXEntry, bool) {
	i := slices.IndexFunc(m.Entries, func(e PTXEntry) bool { return e.Name == name })
	if i < 0 {
		return PTXEntry{}, false
	}
	return m.Entries[i], true
}

// PTXEntry is one ".entry" (kernel).
type PTXEntry struct {
	Name   string
	Params []PTXParam
	// Instructions counts the instruction statements of the body.
	Instructions int
}

// PTXParam is one kernel parameter.
type PTXParam struct {
	Type string // "u64", "u32", …
	Name string
}

// ParsePTX checks PTX text as far as Go can without the driver's JIT: the
// module header (.version, .target, .address_size, in that order, first),
// each entry's name, parameters and balanced body, that every register an
// instruction uses is declared (.reg, including the %r<N> ranges) or a
// special register, that every branch goes to a label of the entry, that
// ld.param reads declared parameters, that opcodes are ones this package
// knows, and that the body returns. Operand types are left to the JIT,
// whose error log the probe reports. Errors name the line.
func ParsePTX(src string) (PTXModule, error) {
	p := &ptxParser{src: stripComments(src)}
	return p.parse()
}

type ptxParser struct {
	src string
	pos int
}

func (p *ptxParser) line(pos int) int { return strings.Count(p.src[:pos], "\n") + 1 }

func (p *ptxParser) errorf(pos int, format string, args ...any) error {
	return fmt.Errorf("ptx line %d: %s", p.line(pos), fmt.Sprintf(format, args...))
}

func (p *ptxParser) skipSpace() {
	for p.pos < len(p.src) && strings.ContainsRune(" \t\r\n", rune(p.src[p.pos])) {
		p.pos++
	}
}

// restOfLine returns the text up to the end of the line and moves past it.
func (p *ptxParser) restOfLine() string {
	end := strings.IndexByte(p.src[p.pos:], '\n')
	if end < 0 {
		end = len(p.src) - p.pos
	}
	s := p.src[p.pos : p.pos+end]
	p.pos += end
	return strings.TrimSpace(s)
}

var (
	versionRE  = regexp.MustCompile(`^\d+\.\d+$`)
	targetRE   = regexp.MustCompile(`^sm_\d+[a-z]?$`)
	entryRE    = regexp.MustCompile(`^(?:\.visible\s+)?\.entry\s+([A-Za-z_$][\w$]*)\s*\(([^)]*)\)\s*$`)
	paramRE    = regexp.MustCompile(`^\.param\s+\.(u8|u16|u32|u64|s8|s16|s32|s64|b8|b16|b32|b64|f32|f64)\s+([A-Za-z_$][\w$]*)$`)
	regDeclRE  = regexp.MustCompile(`^\.reg\s+\.(pred|b8|b16|b32|b64|u8|u16|u32|u64|s8|s16|s32|s64|f16|f32|f64)\s+(.+)$`)
	regNameRE  = regexp.MustCompile(`^(%[A-Za-z_][A-Za-z_]*)(?:<(\d+)>)?$|^(%[A-Za-z_][\w]*)$`)
	labelRE    = regexp.MustCompile(`^([A-Za-z_$][\w$]*):`)
	guardRE    = regexp.MustCompile(`^@!?(%[A-Za-z_]\w*)\s+`)
	opcodeRE   = regexp.MustCompile(`^([a-z]+)((?:\.[a-z0-9_]+)*)`)
	registerRE = regexp.MustCompile(`%[A-Za-z_]\w*`)
	paramRefRE = regexp.MustCompile(`\[([A-Za-z_$][\w$]*)(?:\+\d+)?\]`)
	identRE    = regexp.MustCompile(`^[A-Za-z_$][\w$]*$`)
)

// knownOpcodes are the PTX instructions the check accepts (those a small
// kernel needs); anything else is more likely a typo than intent.
var knownOpcodes = map[string]bool{
	"ld": true, "st": true, "mov": true, "add": true, "sub": true, "mul": true, "mad": true,
	"div": true, "rem": true, "min": true, "max": true, "and": true, "or": true, "xor": true,
	"not": true, "shl": true, "shr": true, "setp": true, "selp": true, "cvt": true, "cvta": true,
	"bra": true, "atom": true, "red": true, "bar": true, "membar": true, "fence": true,
	"ret": true, "exit": true, "nanosleep": true,
}

// specialRegisters are PTX's predefined read-only registers (the part
// before any ".x" component).
var specialRegisters = map[string]bool{
	"%tid": true, "%ntid": true, "%ctaid": true, "%nctaid": true, "%laneid": true, "%warpid": true,
	"%nwarpid": true, "%smid": true, "%nsmid": true, "%gridid": true, "%clock": true,
	"%clock64": true, "%globaltimer": true, "%lanemask_eq": true,
}

func (p *ptxParser) parse() (PTXModule, error) {
	var m PTXModule
	for _, directive := range []string{".version", ".target", ".address_size"} {
		p.skipSpace()
		start := p.pos
		if !strings.HasPrefix(p.src[p.pos:], directive) {
			return m, p.errorf(start, "want %s here (the header is .version, .target, .address_size)", directive)
		}
		p.pos += len(directive)
		val := p.restOfLine()
		switch directive {
		case ".version":
			if !versionRE.MatchString(val) {
				return m, p.errorf(start, ".version %q: want MAJOR.MINOR", val)
			}
			m.Version = val
		case ".target":
			first := strings.TrimSpace(strings.Split(val, ",")[0])
			if !targetRE.MatchString(first) {
				return m, p.errorf(start, ".target %q: want sm_NN", val)
			}
			m.Target = first
		case ".address_size":
			n, err := strconv.Atoi(val)
			if err != nil || (n != 32 && n != 64) {
				return m, p.errorf(start, ".address_size %q: want 32 or 64", val)
			}
			m.AddressSize = n
		}
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.src) {
			break
		}
		e, err := p.entry()
		if err != nil {
			return m, err
		}
		if _, dup := m.Entry(e.Name); dup {
			return m, fmt.Errorf("ptx: entry %s defined twice", e.Name)
		}
		m.Entries = append(m.Entries, e)
	}
	if len(m.Entries) == 0 {
		return m, fmt.Errorf("ptx: no .entry")
	}
	return m, nil
}

func (p *ptxParser) entry() (PTXEntry, error) {
	start := p.pos
	open := strings.IndexByte(p.src[p.pos:], '{')
	if open < 0 {
		return PTXEntry{}, p.errorf(start, "want an .entry with a body in braces")
	}
	header := strings.Join(strings.Fields(p.src[p.pos:p.pos+open]), " ")
	match := entryRE.FindStringSubmatch(header)
	if match == nil {
		return PTXEntry{}, p.errorf(start, "want `.visible .entry NAME(.param .TYPE NAME, ...)`, got %q", header)
	}
	e := PTXEntry{Name: match[1]}
	if params := strings.TrimSpace(match[2]); params != "" {
		for _, raw := range strings.Split(params, ",") {
			pm := paramRE.FindStringSubmatch(strings.TrimSpace(raw))
			if pm == nil {
				return e, p.errorf(start, "entry %s: parameter %q: want `.param .TYPE NAME`", e.Name, strings.TrimSpace(raw))
			}
			e.Params = append(e.Params, PTXParam{Type: pm[1], Name: pm[2]})
		}
	}
	bodyStart := p.pos + open + 1
	depth, i := 1, bodyStart
	for ; i < len(p.src) && depth > 0; i++ {
		switch p.src[i] {
		case '{':
			depth++
		case '}':
			depth--
		}
	}
	if depth != 0 {
		return e, p.errorf(start, "entry %s: body has no closing brace", e.Name)
	}
	bodyEnd := i - 1
	p.pos = i
	n, err := p.body(e, bodyStart, bodyEnd)
	e.Instructions = n
	return e, err
}

// body checks the statements of an entry between [from, to).
func (p *ptxParser) body(e PTXEntry, from, to int) (int, error) {
	type stmt struct {
		text string
		pos  int
	}
	var stmts []stmt
	labels := map[string]bool{}
	pos := from
	for pos < to {
		end := strings.IndexByte(p.src[pos:to], ';')
		if end < 0 {
			if rest := strings.TrimSpace(p.src[pos:to]); rest != "" {
				// Only labels may follow the last statement.
				for rest != "" {
					lm := labelRE.FindStringSubmatch(rest)
					if lm == nil {
						return 0, p.errorf(pos, "entry %s: %q is not terminated by ';'", e.Name, rest)
					}
					labels[lm[1]] = true
					rest = strings.TrimSpace(rest[len(lm[0]):])
				}
			}
			break
		}
		text := p.src[pos : pos+end]
		at := pos + len(text) - len(strings.TrimLeft(text, " \t\r\n"))
		text = strings.TrimSpace(text)
		for {
			lm := labelRE.FindStringSubmatch(text)
			if lm == nil {
				break
			}
			if labels[lm[1]] {
				return 0, p.errorf(at, "entry %s: label %s defined twice", e.Name, lm[1])
			}
			labels[lm[1]] = true
			text = strings.TrimSpace(text[len(lm[0]):])
		}
		if text == "" {
			return 0, p.errorf(at, "entry %s: empty statement", e.Name)
		}
		stmts = append(stmts, stmt{text: strings.Join(strings.Fields(text), " "), pos: at})
		pos += end + 1
	}

	params := map[string]bool{}
	for _, pm := range e.Params {
		params[pm.Name] = true
	}
	declared := map[string]bool{}
	instructions, returns := 0, false
	for _, s := range stmts {
		if strings.HasPrefix(s.text, ".") {
			m := regDeclRE.FindStringSubmatch(s.text)
			if m == nil {
				return 0, p.errorf(s.pos, "entry %s: unsupported directive %q (only .reg declarations)", e.Name, s.text)
			}
			for _, name := range strings.Split(m[2], ",") {
				name = strings.TrimSpace(name)
				rm := regNameRE.FindStringSubmatch(name)
				if rm == nil {
					return 0, p.errorf(s.pos, "entry %s: register %q: want %%name or %%name<N>", e.Name, name)
				}
				if rm[3] != "" {
					declared[rm[3]] = true
					continue
				}
				if rm[2] == "" {
					declared[rm[1]] = true
					continue
				}
				n, _ := strconv.Atoi(rm[2])
				for i := range n {
					declared[rm[1]+strconv.Itoa(i)] = true
				}
			}
			continue
		}
		instructions++
		text := s.text
		if g := guardRE.FindStringSubmatch(text); g != nil {
			if !declared[g[1]] {
				return 0, p.errorf(s.pos, "entry %s: guard predicate %s is not declared", e.Name, g[1])
			}
			text = text[len(g[0]):]
		}
		om := opcodeRE.FindStringSubmatch(text)
		if om == nil || !knownOpcodes[om[1]] {
			return 0, p.errorf(s.pos, "entry %s: unknown instruction %q", e.Name, text)
		}
		operands := strings.TrimSpace(text[len(om[0]):])
		for _, reg := range registerRE.FindAllString(operands, -1) {
			if !declared[reg] && !specialRegisters[reg] {
				return 0, p.errorf(s.pos, "entry %s: register %s is not declared (in %q)", e.Name, reg, s.text)
			}
		}
		switch om[1] {
		case "bra":
			if !identRE.MatchString(operands) || !labels[operands] {
				return 0, p.errorf(s.pos, "entry %s: branch to %q, which is not a label of the entry", e.Name, operands)
			}
		case "ld":
			if strings.HasPrefix(om[2], ".param") {
				for _, ref := range paramRefRE.FindAllStringSubmatch(operands, -1) {
					if !params[ref[1]] {
						return 0, p.errorf(s.pos, "entry %s: ld.param reads %q, which is not a parameter", e.Name, ref[1])
					}
				}
			}
		case "ret", "exit":
			returns = true
		}
	}
	if !returns {
		return 0, fmt.Errorf("ptx: entry %s never returns (no ret or exit)", e.Name)
	}
	return instructions, nil
}

// stripComments blanks // and /* */ comments, keeping newlines so that line
// numbers stay right.
func stripComments(src string) string {
	b := []byte(src)
	for i := 0; i < len(b); i++ {
		switch {
		case b[i] == '/' && i+1 < len(b) && b[i+1] == '/':
			for ; i < len(b) && b[i] != '\n'; i++ {
				b[i] = ' '
			}
		case b[i] == '/' && i+1 < len(b) && b[i+1] == '*':
			for ; i < len(b) && !(b[i] == '*' && i+1 < len(b) && b[i+1] == '/'); i++ {
				if b[i] != '\n' {
					b[i] = ' '
				}
			}
			if i < len(b) {
				b[i] = ' '
				if i+1 < len(b) {
					b[i+1] = ' '
					i++
				}
			}
		}
	}
	return string(b)
}
