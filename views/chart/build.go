package chart

import (
	"math"
)

// Series is one named series of a chart: a value per slot along x. NaN is "no data" (a bar is
// left out, a line breaks), which is not the same as zero.
type Series struct {
	Name   string
	Color  string // an SVG paint ("#0072b2")
	Dash   string // a line's stroke-dasharray ("4 2"); "" is solid
	Values []float64
}

// Spec is what a chart shows: slots along x, stacked bars and lines over one linear y axis
// from zero.
type Spec struct {
	ID    string // unique on the page: the prefix of the ids of its title and description
	Title string
	Desc  string
	// Slots names every slot along x ("11:30"); bars and points are titled with it.
	Slots []string
	// TickAt says which slots get a label on the x axis (nil: every slot). Labels on round
	// times (every 4 hours, every 10 minutes) read better than every n-th slot from wherever
	// the window happens to start.
	TickAt  func(i int) bool
	Stacked []Series // bars, stacked bottom-up in this order
	Lines   []Series
	YUnit   string // what the y axis counts ("sessions", "ms"), printed above it
	Whole   bool   // y values are counts: no fractional ticks
	// Format prints a value in a bar's or point's title (default Label).
	Format        func(float64) string
	Width, Height float64 // the viewBox (default 360 × 200)
}

// Rect is a rectangle in viewBox units.
type Rect struct{ X, Y, W, H float64 }

// Tick is one labelled position on an axis. Anchor is the SVG text-anchor of an x label:
// "middle" under its slot, "end" or "start" when centring would cut it at the picture's edge.
type Tick struct {
	Pos    float64
	Label  string
	Anchor string
}

// labelHalfWidth is about half the width of a short x label ("12:00") in viewBox units at the
// charts' font size: how close to an edge a label may be centred.
const labelHalfWidth = 16

// Bar is one segment of a stacked bar.
type Bar struct {
	Rect
	Color string
	Text  string // "Registered, 11:30: 12"
}

// Dot is one point of a line.
type Dot struct {
	Point
	Text string
}

// Line is one series drawn as a polyline with a dot per value.
type Line struct {
	D     string // path data
	Color string
	Dash  string
	Dots  []Dot
}

// Key is one entry of the legend.
type Key struct {
	Name, Color, Dash string
	Line              bool // drawn as a line, not a filled swatch
}

// Chart is the geometry of a Spec, ready to print as SVG.
type Chart struct {
	ID, Title, Desc, YUnit string
	Width, Height          float64
	Plot                   Rect
	YTicks, XTicks         []Tick
	Bars                   []Bar
	Lines                  []Line
	Legend                 []Key
	// Empty: no series has a single value (nothing was measured in the whole window).
	Empty bool
}

// The plot's margins inside the viewBox: room for the y labels on the left, the unit above,
// the x labels below.
const (
	marginLeft   = 34
	marginRight  = 8
	marginTop    = 18
	marginBottom = 22
	barShare     = 0.8 // of a slot's width; the rest is the gap between bars
)

// Build lays a Spec out.
func Build(s Spec) Chart {
	if s.Width == 0 {
		s.Width = 360
	}
	if s.Height == 0 {
		s.Height = 200
	}
	if s.Format == nil {
		s.Format = Label
	}
	c := Chart{ID: s.ID, Title: s.Title, Desc: s.Desc, YUnit: s.YUnit, Width: s.Width, Height: s.Height,
		Plot: Rect{X: marginLeft, Y: marginTop, W: s.Width - marginLeft - marginRight, H: s.Height - marginTop - marginBottom}}
	n := len(s.Slots)

	// The y axis holds the tallest stack and the highest point.
	top, empty := 0.0, true
	for i := range n {
		stack := 0.0
		for _, se := range s.Stacked {
			if v := at(se.Values, i); !math.IsNaN(v) {
				stack += v
				empty = false
			}
		}
		top = math.Max(top, stack)
		for _, se := range s.Lines {
			if v := at(se.Values, i); !math.IsNaN(v) {
				top = math.Max(top, v)
				empty = false
			}
		}
	}
	c.Empty = empty
	top, ticks := Ticks(top, 4, s.Whole)
	y := Linear{D0: 0, D1: top, R0: c.Plot.Y + c.Plot.H, R1: c.Plot.Y}
	for _, t := range ticks {
		c.YTicks = append(c.YTicks, Tick{Pos: y.At(t), Label: Label(t)})
	}

	slot := 0.0
	if n > 0 {
		slot = c.Plot.W / float64(n)
	}
	center := func(i int) float64 { return c.Plot.X + (float64(i)+0.5)*slot }
	for i := range n {
		if s.TickAt == nil || s.TickAt(i) {
			t := Tick{Pos: center(i), Label: s.Slots[i], Anchor: "middle"}
			switch {
			case t.Pos+labelHalfWidth > s.Width:
				t.Pos, t.Anchor = s.Width, "end"
			case t.Pos-labelHalfWidth < 0:
				t.Pos, t.Anchor = 0, "start"
			}
			c.XTicks = append(c.XTicks, t)
		}
	}

	for i := range n {
		base := 0.0
		for _, se := range s.Stacked {
			v := at(se.Values, i)
			if math.IsNaN(v) || v <= 0 {
				continue // nothing to draw; a zero is in the numbers table
			}
			y0, y1 := y.At(base), y.At(base+v)
			c.Bars = append(c.Bars, Bar{Rect: Rect{X: center(i) - slot*barShare/2, Y: y1, W: slot * barShare, H: y0 - y1},
				Color: se.Color, Text: se.Name + ", " + s.Slots[i] + ": " + s.Format(v)})
			base += v
		}
	}
	for _, se := range s.Stacked {
		c.Legend = append(c.Legend, Key{Name: se.Name, Color: se.Color})
	}
	for _, se := range s.Lines {
		l := Line{Color: se.Color, Dash: se.Dash}
		pts := make([]Point, n)
		for i := range n {
			v := at(se.Values, i)
			pts[i] = Point{X: center(i), Y: math.NaN()}
			if !math.IsNaN(v) {
				pts[i].Y = y.At(v)
				l.Dots = append(l.Dots, Dot{Point: pts[i], Text: se.Name + ", " + s.Slots[i] + ": " + s.Format(v)})
			}
		}
		l.D = Path(pts)
		c.Lines = append(c.Lines, l)
		c.Legend = append(c.Legend, Key{Name: se.Name, Color: se.Color, Dash: se.Dash, Line: true})
	}
	return c
}

// at is values[i], or NaN past its end.
func at(values []float64, i int) float64 {
	if i < len(values) {
		return values[i]
	}
	return math.NaN()
}

// Meter is one row of a horizontal gauge: value out of max, as a bar over a track.
type Meter struct {
	Track Rect // the whole width: max
	Fill  Rect // the value's share of it
}

// NewMeter lays out value of max on a track of width w at (x, y), h high. A value above max
// fills the track (a gauge does not overflow its frame); max <= 0 draws no fill.
func NewMeter(value, maxValue, x, y, w, h float64) Meter {
	m := Meter{Track: Rect{X: x, Y: y, W: w, H: h}, Fill: Rect{X: x, Y: y, H: h}}
	if maxValue > 0 && value > 0 {
		m.Fill.W = Linear{D0: 0, D1: maxValue, R0: 0, R1: w}.At(math.Min(value, maxValue))
	}
	return m
}
