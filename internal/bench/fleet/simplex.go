package fleet

import (
	"errors"
	"math"
)

// lp is a linear program max c·x subject to A x <= b (b >= 0), 0 <= x <= u,
// solved by a bounded-variable revised simplex with an explicit basis
// inverse. Columns can be added between solves (column generation); the
// basis carries over. It is small and dense on purpose: the bound's master
// problems have a few hundred rows.
type lp struct {
	m    int
	b    []float64
	vars []lpVar
	// basis[r] is the variable basic in row r; binv is the basis inverse and
	// xb the basic variables' values.
	basis []int
	binv  [][]float64
	xb    []float64
	// pivots since binv was last rebuilt from the basis.
	pivots int
}

type lpVar struct {
	rows  []int
	vals  []float64
	cost  float64
	upper float64 // math.Inf(1) when unbounded above
	// state: the variable is basic, or nonbasic at 0 or at upper.
	basic, atUpper bool
}

// newLP makes a program with m rows of right-hand sides b and a slack
// variable per row (variables 0..m-1), the slacks basic.
func newLP(b []float64) *lp {
	m := len(b)
	p := &lp{m: m, b: append([]float64(nil), b...), basis: make([]int, m), binv: identity(m), xb: append([]float64(nil), b...)}
	for i := range m {
		p.vars = append(p.vars, lpVar{rows: []int{i}, vals: []float64{1}, upper: math.Inf(1), basic: true})
		p.basis[i] = i
	}
	return p
}

func identity(m int) [][]float64 {
	out := make([][]float64, m)
	for i := range out {
		out[i] = make([]float64, m)
		out[i][i] = 1
	}
	return out
}

// addColumn adds a structural variable, nonbasic at 0, and returns its index.
func (p *lp) addColumn(rows []int, vals []float64, cost, upper float64) int {
	p.vars = append(p.vars, lpVar{rows: rows, vals: vals, cost: cost, upper: upper})
	return len(p.vars) - 1
}

// duals are c_B B⁻¹: the shadow price of each row.
func (p *lp) duals() []float64 {
	pi := make([]float64, p.m)
	for r, v := range p.basis {
		c := p.vars[v].cost
		if c == 0 {
			continue
		}
		row := p.binv[r]
		for i := range pi {
			pi[i] += c * row[i]
		}
	}
	return pi
}

func (p *lp) reducedCost(v int, pi []float64) float64 {
	x := &p.vars[v]
	d := x.cost
	for k, r := range x.rows {
		d -= pi[r] * x.vals[k]
	}
	return d
}

// column is B⁻¹ a_v.
func (p *lp) column(v int) []float64 {
	x := &p.vars[v]
	out := make([]float64, p.m)
	for k, r := range x.rows {
		a := x.vals[k]
		for i := range out {
			out[i] += p.binv[i][r] * a
		}
	}
	return out
}

// objective is c·x at the current vertex.
func (p *lp) objective() float64 {
	var z float64
	for r, v := range p.basis {
		z += p.vars[v].cost * p.xb[r]
	}
	for i := range p.vars {
		if x := &p.vars[i]; !x.basic && x.atUpper {
			z += x.cost * x.upper
		}
	}
	return z
}

var errLPUnbounded = errors.New("lp: unbounded")

// solve runs primal simplex from the current basis to optimality (Dantzig's
// rule, Bland's after a run of degenerate pivots), at most maxIter pivots.
func (p *lp) solve(maxIter int) error {
	const tol = 1e-9
	degenerate := 0
	for iter := 0; iter < maxIter; iter++ {
		if p.pivots >= 100 {
			if err := p.refactor(); err != nil {
				return err
			}
		}
		pi := p.duals()
		enter, dir, best := -1, 0, 0.0
		bland := degenerate > 50
		for v := range p.vars {
			x := &p.vars[v]
			if x.basic {
				continue
			}
			d := p.reducedCost(v, pi)
			switch {
			case !x.atUpper && d > tol:
				if bland {
					enter, dir = v, 1
				} else if d > best {
					enter, dir, best = v, 1, d
				}
			case x.atUpper && d < -tol:
				if bland {
					enter, dir = v, -1
				} else if -d > best {
					enter, dir, best = v, -1, -d
				}
			}
			if bland && enter >= 0 {
				break
			}
		}
		if enter < 0 {
			return nil
		}
		alpha := p.column(enter)
		x := &p.vars[enter]
		theta, leave, leaveUpper := x.upper, -1, false
		for r := range p.m {
			delta := -float64(dir) * alpha[r]
			bv := &p.vars[p.basis[r]]
			switch {
			case delta < -tol:
				if t := p.xb[r] / -delta; t < theta {
					theta, leave, leaveUpper = t, r, false
				}
			case delta > tol && !math.IsInf(bv.upper, 1):
				if t := (bv.upper - p.xb[r]) / delta; t < theta {
					theta, leave, leaveUpper = t, r, true
				}
			}
		}
		if math.IsInf(theta, 1) {
			return errLPUnbounded
		}
		theta = max(theta, 0)
		if theta < tol {
			degenerate++
		} else {
			degenerate = 0
		}
		for r := range p.m {
			p.xb[r] -= float64(dir) * alpha[r] * theta
		}
		if leave < 0 { // the entering variable reaches its other bound
			x.atUpper = !x.atUpper
			continue
		}
		out := &p.vars[p.basis[leave]]
		out.basic, out.atUpper = false, leaveUpper
		x.basic = true
		if dir > 0 {
			p.xb[leave] = theta
		} else {
			p.xb[leave] = x.upper - theta
		}
		x.atUpper = false
		p.basis[leave] = enter
		p.pivot(leave, alpha)
	}
	return errors.New("lp: iteration limit")
}

// pivot updates B⁻¹ for the entering column alpha replacing row r's variable.
func (p *lp) pivot(r int, alpha []float64) {
	pr := p.binv[r]
	inv := 1 / alpha[r]
	for k := range pr {
		pr[k] *= inv
	}
	for i := range p.m {
		if i == r || alpha[i] == 0 {
			continue
		}
		f := alpha[i]
		row := p.binv[i]
		for k := range row {
			row[k] -= f * pr[k]
		}
	}
	p.pivots++
}

// refactor rebuilds B⁻¹ from the basis by Gauss–Jordan elimination and
// recomputes the basic values, so rounding does not accumulate.
func (p *lp) refactor() error {
	m := p.m
	a := make([][]float64, m)
	for i := range a {
		a[i] = make([]float64, 2*m)
		a[i][m+i] = 1
	}
	for r, v := range p.basis {
		x := &p.vars[v]
		for k, row := range x.rows {
			a[row][r] = x.vals[k]
		}
	}
	for c := range m {
		piv := c
		for i := c + 1; i < m; i++ {
			if math.Abs(a[i][c]) > math.Abs(a[piv][c]) {
				piv = i
			}
		}
		if math.Abs(a[piv][c]) < 1e-12 {
			return errors.New("lp: singular basis")
		}
		a[c], a[piv] = a[piv], a[c]
		inv := 1 / a[c][c]
		for k := range a[c] {
			a[c][k] *= inv
		}
		for i := range m {
			if i == c || a[i][c] == 0 {
				continue
			}
			f := a[i][c]
			for k := range a[i] {
				a[i][k] -= f * a[c][k]
			}
		}
	}
	for i := range m {
		copy(p.binv[i], a[i][m:])
	}
	// x_B = B⁻¹ (b − Σ_{j at upper} a_j u_j)
	rhs := append([]float64(nil), p.b...)
	for v := range p.vars {
		x := &p.vars[v]
		if !x.basic && x.atUpper {
			for k, r := range x.rows {
				rhs[r] -= x.vals[k] * x.upper
			}
		}
	}
	for i := range m {
		var s float64
		for k := range m {
			s += p.binv[i][k] * rhs[k]
		}
		p.xb[i] = s
	}
	p.pivots = 0
	return nil
}
