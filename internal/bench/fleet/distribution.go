package fleet

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
)

// Demand is what one job needs of one GPU, as fractions in (0, 1]: memory of the
// GPU's memory, cores of its compute. They need not be equal.
type Demand struct {
	Memory, Cores float64
}

// Max is the larger of the two fractions: the share of a GPU the job blocks.
func (d Demand) Max() float64 { return max(d.Memory, d.Cores) }

// Distribution draws job demands. Sample must be deterministic for a given rng.
type Distribution interface {
	// Name is how the report names it, for example "normal(0.30, 0.10)".
	Name() string
	// Sample draws one demand; both fractions are in [MinDemand, 1].
	Sample(rng *rand.Rand) Demand
}

// MeanDemand is the mean of Demand.Max over a fixed sample of d (exact enough
// for the arrival rate and the report, and deterministic).
func MeanDemand(d Distribution) float64 {
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 200000
	var sum float64
	for range n {
		sum += d.Sample(rng).Max()
	}
	return sum / n
}

func clip(x float64) float64 { return min(max(x, MinDemand), 1) }

// Normal is KubeShare §5.3's demand: Normal(Mean, SD) clipped to [MinDemand, 1],
// memory and cores equal.
type Normal struct{ Mean, SD float64 }

func (n Normal) Name() string { return fmt.Sprintf("normal(%.2f, %.2f)", n.Mean, n.SD) }
func (n Normal) Sample(rng *rand.Rand) Demand {
	d := clip(n.Mean + n.SD*rng.NormFloat64())
	return Demand{d, d}
}

// LogNormal is a heavy-tailed demand: exp(Normal(ln Median, Sigma)), clipped.
type LogNormal struct{ Median, Sigma float64 }

func (l LogNormal) Name() string {
	return fmt.Sprintf("lognormal(median %.2f, σ %.2f)", l.Median, l.Sigma)
}
func (l LogNormal) Sample(rng *rand.Rand) Demand {
	d := clip(l.Median * math.Exp(l.Sigma*rng.NormFloat64()))
	return Demand{d, d}
}

// Pareto is a heavy-tailed demand: Xmin / U^(1/Alpha), clipped to 1.
type Pareto struct{ Xmin, Alpha float64 }

func (p Pareto) Name() string { return fmt.Sprintf("pareto(xmin %.2f, α %.2f)", p.Xmin, p.Alpha) }
func (p Pareto) Sample(rng *rand.Rand) Demand {
	u := 1 - rng.Float64() // (0, 1]
	d := clip(p.Xmin / math.Pow(u, 1/p.Alpha))
	return Demand{d, d}
}

// Uniform draws from [Lo, Hi].
type Uniform struct{ Lo, Hi float64 }

func (u Uniform) Name() string { return fmt.Sprintf("uniform(%.2f, %.2f)", u.Lo, u.Hi) }
func (u Uniform) Sample(rng *rand.Rand) Demand {
	d := clip(u.Lo + (u.Hi-u.Lo)*rng.Float64())
	return Demand{d, d}
}

// Discrete draws one of Values with the given Weights (normalised), for example
// the fractions 1/8, 1/4, 1/2 users ask for.
type Discrete struct {
	Values, Weights []float64
	labels          []string
}

func (d Discrete) Name() string {
	var parts []string
	total := sum(d.Weights)
	for i := range d.Values {
		l := strconv.FormatFloat(d.Values[i], 'g', 3, 64)
		if i < len(d.labels) {
			l = d.labels[i]
		}
		parts = append(parts, fmt.Sprintf("%s:%.0f%%", l, 100*d.Weights[i]/total))
	}
	return "discrete(" + strings.Join(parts, " ") + ")"
}

func (d Discrete) Sample(rng *rand.Rand) Demand {
	x := rng.Float64() * sum(d.Weights)
	for i, w := range d.Weights {
		if x < w || i == len(d.Weights)-1 {
			v := clip(d.Values[i])
			return Demand{v, v}
		}
		x -= w
	}
	panic("unreachable")
}

// Mixture draws from Parts[i] with probability Weights[i] (normalised).
type Mixture struct {
	Parts   []Distribution
	Weights []float64
}

func (m Mixture) Name() string {
	var parts []string
	total := sum(m.Weights)
	for i, p := range m.Parts {
		parts = append(parts, fmt.Sprintf("%.0f%% %s", 100*m.Weights[i]/total, p.Name()))
	}
	return "mix(" + strings.Join(parts, " + ") + ")"
}

func (m Mixture) Sample(rng *rand.Rand) Demand {
	x := rng.Float64() * sum(m.Weights)
	for i, w := range m.Weights {
		if x < w || i == len(m.Weights)-1 {
			return m.Parts[i].Sample(rng)
		}
		x -= w
	}
	panic("unreachable")
}

// SplitCores gives the cores a demand of their own: Cores drawn independently
// from CoresDist, or Scale × memory (clipped) when CoresDist is nil.
type SplitCores struct {
	Memory    Distribution
	CoresDist Distribution
	Scale     float64
}

func (s SplitCores) Name() string {
	if s.CoresDist != nil {
		return fmt.Sprintf("memory %s, cores %s", s.Memory.Name(), s.CoresDist.Name())
	}
	return fmt.Sprintf("memory %s, cores %.2g × memory", s.Memory.Name(), s.Scale)
}

func (s SplitCores) Sample(rng *rand.Rand) Demand {
	d := s.Memory.Sample(rng)
	if s.CoresDist != nil {
		d.Cores = s.CoresDist.Sample(rng).Memory
	} else {
		d.Cores = clip(d.Memory * s.Scale)
	}
	return d
}

func sum(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s
}

// ParseFraction reads "1/4", "0.25" or "25%" as a fraction in (0, 1].
func ParseFraction(s string) (float64, error) {
	s = strings.TrimSpace(s)
	var v float64
	var err error
	switch {
	case strings.HasSuffix(s, "%"):
		v, err = strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
		v /= 100
	case strings.Contains(s, "/"):
		num, den, _ := strings.Cut(s, "/")
		var n, d float64
		if n, err = strconv.ParseFloat(num, 64); err == nil {
			if d, err = strconv.ParseFloat(den, 64); err == nil && d == 0 {
				err = errors.New("division by zero")
			}
		}
		if err == nil {
			v = n / d
		}
	default:
		v, err = strconv.ParseFloat(s, 64)
	}
	if err != nil {
		return 0, fmt.Errorf("%q: not a fraction (1/4, 0.25 or 25%%)", s)
	}
	if !(v > 0 && v <= 1) {
		return 0, fmt.Errorf("%q: a fraction of a GPU must be in (0, 1]", s)
	}
	return v, nil
}

// DistributionSyntax documents ParseDistribution for flags and errors.
const DistributionSyntax = `normal:MEAN,SD | lognormal:MEDIAN,SIGMA | pareto:XMIN,ALPHA | uniform:LO,HI | ` +
	`discrete:V=W,V=W,... (V a fraction such as 1/4 or 0.25, W a weight) | ` +
	`mix:W*DIST+W*DIST+... ; any of them followed by "|cores=DIST" (cores drawn independently) or "|cores=F*mem"`

// ParseDistribution reads a distribution spec (DistributionSyntax), for example
// "normal:0.3,0.1", "discrete:1/8=2,1/4=1,1/2=1", "mix:0.8*normal:0.1,0.05+0.2*discrete:1=1",
// "pareto:0.05,1.5|cores=0.5*mem".
func ParseDistribution(spec string) (Distribution, error) {
	spec = strings.TrimSpace(spec)
	if memSpec, coresSpec, ok := strings.Cut(spec, "|"); ok {
		mem, err := ParseDistribution(memSpec)
		if err != nil {
			return nil, err
		}
		c, ok := strings.CutPrefix(strings.TrimSpace(coresSpec), "cores=")
		if !ok {
			return nil, fmt.Errorf("%q: after | expected cores=DIST or cores=F*mem", coresSpec)
		}
		if f, ok := strings.CutSuffix(c, "*mem"); ok {
			scale, err := strconv.ParseFloat(f, 64)
			if err != nil || scale <= 0 {
				return nil, fmt.Errorf("%q: cores=F*mem needs a positive F", coresSpec)
			}
			return SplitCores{Memory: mem, Scale: scale}, nil
		}
		cores, err := ParseDistribution(c)
		if err != nil {
			return nil, err
		}
		return SplitCores{Memory: mem, CoresDist: cores}, nil
	}
	kind, args, ok := strings.Cut(spec, ":")
	if !ok {
		return nil, fmt.Errorf("%q: expected KIND:ARGS, one of %s", spec, DistributionSyntax)
	}
	nums := func(n int) ([]float64, error) {
		parts := strings.Split(args, ",")
		if len(parts) != n {
			return nil, fmt.Errorf("%s: %d numbers expected, got %q", kind, n, args)
		}
		out := make([]float64, n)
		for i, p := range parts {
			v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
			if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("%s: %q is not a number", kind, p)
			}
			out[i] = v
		}
		return out, nil
	}
	switch kind {
	case "normal", "lognormal", "pareto", "uniform":
		v, err := nums(2)
		if err != nil {
			return nil, err
		}
		a, b := v[0], v[1]
		var (
			d     Distribution
			valid bool
			want  string
		)
		switch kind {
		case "normal":
			d, valid, want = Normal{a, b}, a > 0 && a <= 1 && b >= 0, "0 < MEAN <= 1 and SD >= 0"
		case "lognormal":
			d, valid, want = LogNormal{a, b}, a > 0 && a <= 1 && b >= 0, "0 < MEDIAN <= 1 and SIGMA >= 0"
		case "pareto":
			d, valid, want = Pareto{a, b}, a > 0 && a <= 1 && b > 0, "0 < XMIN <= 1 and ALPHA > 0"
		case "uniform":
			d, valid, want = Uniform{a, b}, a > 0 && b <= 1 && a <= b, "0 < LO <= HI <= 1"
		}
		if !valid {
			return nil, fmt.Errorf("%s:%s: want %s", kind, args, want)
		}
		return d, nil
	case "discrete":
		var d Discrete
		for _, p := range strings.Split(args, ",") {
			vs, ws, ok := strings.Cut(p, "=")
			if !ok {
				ws = "1"
			}
			v, err := ParseFraction(vs)
			if err != nil {
				return nil, fmt.Errorf("discrete: %w", err)
			}
			w, err := strconv.ParseFloat(strings.TrimSpace(ws), 64)
			if err != nil || w <= 0 {
				return nil, fmt.Errorf("discrete: weight %q must be a positive number", ws)
			}
			d.Values, d.Weights, d.labels = append(d.Values, v), append(d.Weights, w), append(d.labels, strings.TrimSpace(vs))
		}
		return d, nil
	case "mix":
		var m Mixture
		for _, p := range splitMix(args) {
			ws, ds, ok := strings.Cut(p, "*")
			if !ok {
				return nil, fmt.Errorf("mix: %q: expected W*DIST", p)
			}
			w, err := strconv.ParseFloat(strings.TrimSpace(ws), 64)
			if err != nil || w <= 0 {
				return nil, fmt.Errorf("mix: weight %q must be a positive number", ws)
			}
			d, err := ParseDistribution(ds)
			if err != nil {
				return nil, fmt.Errorf("mix: %w", err)
			}
			m.Parts, m.Weights = append(m.Parts, d), append(m.Weights, w)
		}
		if len(m.Parts) == 0 {
			return nil, errors.New("mix: no parts")
		}
		return m, nil
	}
	return nil, fmt.Errorf("%q: unknown distribution %q; one of %s", spec, kind, DistributionSyntax)
}

// splitMix splits "W*DIST+W*DIST" at the + signs that start a new W*.
func splitMix(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] != '+' {
			continue
		}
		rest := s[i+1:]
		if j := strings.IndexByte(rest, '*'); j > 0 {
			if _, err := strconv.ParseFloat(strings.TrimSpace(rest[:j]), 64); err == nil {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}

// ReadTrace reads a job trace as CSV: a header naming the columns, then one job
// per line. Columns: arrival (seconds), runtime (seconds), and either demand
// (memory and cores alike) or memory and cores; fractions as 0.25, 1/4 or 25%.
// Optional: gpus (a number of whole GPUs; 0 or empty: one share of the
// demand, which is then ignored otherwise), nvlink (true: a multi-GPU job's
// GPUs in one NVLink domain) and models (GPU models the job may use, by
// catalogue name, separated by |). Jobs are sorted by arrival and numbered
// in that order.
func ReadTrace(r io.Reader) ([]Job, error) {
	cr := csv.NewReader(r)
	cr.TrimLeadingSpace = true
	cr.Comment = '#'
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("trace: header: %w", err)
	}
	col := map[string]int{}
	for i, h := range header {
		col[strings.ToLower(strings.TrimSpace(h))] = i
	}
	need := func(name string) (int, error) {
		i, ok := col[name]
		if !ok {
			return 0, fmt.Errorf("trace: no %q column (header %q; want arrival, runtime and demand or memory and cores)", name, header)
		}
		return i, nil
	}
	ia, err := need("arrival")
	if err != nil {
		return nil, err
	}
	ir, err := need("runtime")
	if err != nil {
		return nil, err
	}
	im, ic := -1, -1
	if i, ok := col["demand"]; ok {
		im, ic = i, i
	} else {
		if im, err = need("memory"); err != nil {
			return nil, err
		}
		if ic, err = need("cores"); err != nil {
			return nil, err
		}
	}
	var jobs []Job
	err = eachRecord(cr, "trace", func(line int, rec []string) error {
		num := func(i int, what string) (float64, error) {
			v, err := strconv.ParseFloat(strings.TrimSpace(rec[i]), 64)
			if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
				return 0, fmt.Errorf("trace line %d: %s %q: want a non-negative number of seconds", line, what, rec[i])
			}
			return v, nil
		}
		a, err := num(ia, "arrival")
		if err != nil {
			return err
		}
		rt, err := num(ir, "runtime")
		if err != nil {
			return err
		}
		opt := func(name string) string {
			if i, ok := col[name]; ok && i < len(rec) {
				return strings.TrimSpace(rec[i])
			}
			return ""
		}
		gpus := 0
		if g := opt("gpus"); g != "" {
			if gpus, err = strconv.Atoi(g); err != nil || gpus < 0 || gpus > 16 {
				return fmt.Errorf("trace line %d: gpus %q: want 0..16", line, g)
			}
		}
		var j Job
		if gpus > 0 {
			j = newJob(0, a, Demand{1, 1}, rt)
			j.GPUs = gpus
		} else {
			mem, err := ParseFraction(rec[im])
			if err != nil {
				return fmt.Errorf("trace line %d: memory: %w", line, err)
			}
			cores, err := ParseFraction(rec[ic])
			if err != nil {
				return fmt.Errorf("trace line %d: cores: %w", line, err)
			}
			j = newJob(0, a, Demand{mem, cores}, rt)
		}
		if v := opt("nvlink"); v != "" {
			if j.NVLink, err = strconv.ParseBool(v); err != nil {
				return fmt.Errorf("trace line %d: nvlink %q: want true or false", line, v)
			}
		}
		if v := opt("models"); v != "" {
			for _, n := range strings.Split(v, "|") {
				m, ok := LookupModel(strings.TrimSpace(n))
				if !ok {
					return fmt.Errorf("trace line %d: GPU model %q is not in the catalogue (%s)", line, n, FleetSyntax)
				}
				j.Models = append(j.Models, m.Name)
			}
		}
		jobs = append(jobs, j)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(jobs) == 0 {
		return nil, errors.New("trace: no jobs")
	}
	slices.SortStableFunc(jobs, func(a, b Job) int {
		switch {
		case a.Arrival < b.Arrival:
			return -1
		case a.Arrival > b.Arrival:
			return 1
		}
		return 0
	})
	for i := range jobs {
		jobs[i].ID = i
	}
	return jobs, nil
}

// Trace is a fixed job list as a Distribution of its own demands (for the
// report's name and mean).
type Trace struct {
	Path string
	Jobs []Job
}

func (t Trace) Name() string { return "trace " + t.Path }
func (t Trace) Sample(rng *rand.Rand) Demand {
	j := t.Jobs[rng.IntN(len(t.Jobs))]
	return Demand{j.Memory, j.Cores}
}
