// Package chart turns series of numbers into the geometry of a small SVG chart: scales, nice
// axis ticks, stacked bars, polylines with gaps. It is pure Go (no templ, no I/O), so the
// arithmetic is unit-tested here and the templ components in package views only print it.
//
// Why no chart library: the console's Content-Security-Policy allows no inline script or style
// and no other origin, so a JavaScript chart library is out, and the Go ones render whole images
// (PNG, or SVG with style attributes) with no accessible text. What the Operations page needs —
// stacked bars and lines on one linear axis — is this file.
package chart

import (
	"math"
	"strconv"
	"strings"
)

// Linear maps the domain [D0, D1] onto the range [R0, R1] (an SVG y range runs downwards:
// R0 is the bottom of the plot, R1 its top).
type Linear struct{ D0, D1, R0, R1 float64 }

// At maps v. A degenerate domain maps everything to R0.
func (l Linear) At(v float64) float64 {
	if l.D1 == l.D0 {
		return l.R0
	}
	return l.R0 + (v-l.D0)/(l.D1-l.D0)*(l.R1-l.R0)
}

// NiceCeil rounds v up to the next 1, 2, 2.5 or 5 × 10^k, so axis ticks fall on round numbers:
// NiceCeil(7) = 10, NiceCeil(230) = 250, NiceCeil(0.3) = 0.5. Zero and below give 1.
func NiceCeil(v float64) float64 {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if c := m * p; c >= v*(1-1e-12) {
			return c
		}
	}
	return 10 * p
}

// Ticks returns the top of an axis from zero that holds max, and the ticks from zero to it in
// steps of a round size, about n of them: Ticks(37, 4, true) = 40, [0 10 20 30 40]. With whole
// set (counts) no tick is fractional: Ticks(2, 4, true) = 2, [0 1 2]; Ticks(10, 4, true) = 10,
// [0 5 10].
func Ticks(max float64, n int, whole bool) (top float64, ticks []float64) {
	if n < 1 {
		n = 1
	}
	step := NiceCeil(max / float64(n))
	if whole && step < 1 {
		step = 1
	}
	if whole && step != math.Floor(step) {
		step = NiceCeil(step * 1.01) // 2.5 → 5: counts come in wholes
	}
	top = round(step*math.Ceil(max/step-1e-9), step)
	if top <= 0 {
		top = step
	}
	for v := 0.0; v <= top+step/2; v += step {
		ticks = append(ticks, round(v, step))
	}
	return top, ticks
}

// round removes the floating-point dust of repeated addition (0.1+0.2) at the step's precision.
func round(v, step float64) float64 {
	q := math.Pow(10, math.Max(0, -math.Floor(math.Log10(step)))+2)
	return math.Round(v*q) / q
}

// Point is a position in the chart's viewBox units.
type Point struct{ X, Y float64 }

// Path is the SVG path data of a polyline through pts. A point with a NaN Y is a gap in the
// data: the line stops before it and starts again after it (a missing sample is not a zero).
func Path(pts []Point) string {
	var b strings.Builder
	pen := false
	for _, p := range pts {
		if math.IsNaN(p.Y) {
			pen = false
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		if pen {
			b.WriteByte('L')
		} else {
			b.WriteByte('M')
		}
		b.WriteString(Num(p.X))
		b.WriteByte(' ')
		b.WriteString(Num(p.Y))
		pen = true
	}
	return b.String()
}

// Num prints a coordinate with at most one decimal: short markup, and a tenth of a viewBox unit
// is below what any screen shows.
func Num(v float64) string {
	return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64)
}

// Label prints an axis or table value the short way people read figures: 950, 1.2k, 12k, 3.4M.
func Label(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e6:
		return short(v/1e6) + "M"
	case a >= 1e4:
		return strconv.FormatFloat(math.Round(v/1e3), 'f', -1, 64) + "k"
	case a >= 1e3:
		return short(v/1e3) + "k"
	default:
		return short(v)
	}
}

func short(v float64) string {
	if math.Abs(v) >= 100 {
		return strconv.FormatFloat(math.Round(v), 'f', -1, 64)
	}
	return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64)
}
