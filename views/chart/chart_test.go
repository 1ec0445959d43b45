package chart

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestLinear(t *testing.T) {
	t.Parallel()
	y := Linear{D0: 0, D1: 40, R0: 180, R1: 16}
	for _, c := range []struct{ v, want float64 }{{0, 180}, {40, 16}, {20, 98}, {10, 139}} {
		if got := y.At(c.v); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("At(%v) = %v, want %v", c.v, got, c.want)
		}
	}
	if got := (Linear{D0: 5, D1: 5, R0: 3, R1: 9}).At(7); got != 3 {
		t.Errorf("degenerate domain: %v", got)
	}
}

func TestNiceCeil(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ v, want float64 }{
		{7, 10}, {10, 10}, {11, 20}, {230, 250}, {0.3, 0.5}, {1, 1}, {1.5, 2}, {3, 5}, {4999, 5000}, {0, 1}, {-3, 1}, {math.NaN(), 1},
	} {
		if got := NiceCeil(c.v); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("NiceCeil(%v) = %v, want %v", c.v, got, c.want)
		}
	}
}

func TestTicks(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		max   float64
		whole bool
		top   float64
		ticks []float64
	}{
		{37, true, 40, []float64{0, 10, 20, 30, 40}},
		{2, true, 2, []float64{0, 1, 2}},
		{0, true, 1, []float64{0, 1}},
		{0.3, false, 0.3, []float64{0, 0.1, 0.2, 0.3}},
		{1234, true, 1500, []float64{0, 500, 1000, 1500}}, // 1234/4 = 308.5: a step of 500
		{230, false, 300, []float64{0, 100, 200, 300}},
		{10, true, 10, []float64{0, 2.5, 5, 7.5, 10}[:0]},
	} {
		top, ticks := Ticks(c.max, 4, c.whole)
		if c.max == 10 {
			c.ticks = []float64{0, 5, 10} // 2.5 is a nice step, but counts do not come in halves
		}
		if top != c.top || !slices.Equal(ticks, c.ticks) {
			t.Errorf("Ticks(%v) = %v %v, want %v %v", c.max, top, ticks, c.top, c.ticks)
		}
		if top < c.max {
			t.Errorf("Ticks(%v): top %v does not hold the maximum", c.max, top)
		}
	}
}

func TestPathBreaksAtGaps(t *testing.T) {
	t.Parallel()
	nan := math.NaN()
	got := Path([]Point{{0, 1}, {10, 2.25}, {20, nan}, {30, 4}, {40, 5.04}, {50, nan}})
	if want := "M0 1 L10 2.3 M30 4 L40 5"; got != want {
		t.Fatalf("Path = %q, want %q", got, want)
	}
	if Path(nil) != "" || Path([]Point{{1, nan}}) != "" {
		t.Fatal("a path with no values draws something")
	}
}

func TestLabel(t *testing.T) {
	t.Parallel()
	for v, want := range map[float64]string{0: "0", 7: "7", 2.5: "2.5", 950: "950", 1200: "1.2k", 12345: "12k",
		3_400_000: "3.4M", 152.4: "152", 0.25: "0.3"} {
		if got := Label(v); got != want {
			t.Errorf("Label(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestBuildStacksBars: each non-zero value is one bar segment, stacked bottom-up within its
// slot; a NaN slot draws nothing; the axis holds the tallest stack; x labels where TickAt says.
func TestBuildStacksBars(t *testing.T) {
	t.Parallel()
	nan := math.NaN()
	c := Build(Spec{ID: "t", Slots: []string{"a", "b", "c", "d"}, TickAt: func(i int) bool { return i%2 == 0 }, Whole: true,
		Stacked: []Series{
			{Name: "one", Color: "#111", Values: []float64{1, 0, nan, 3}},
			{Name: "two", Color: "#222", Values: []float64{2, 5, nan, 4}},
		}})
	if len(c.Bars) != 5 {
		t.Fatalf("%d bars, want 5 (zeros and gaps draw none)", len(c.Bars))
	}
	if c.Empty {
		t.Fatal("a chart with values is empty")
	}
	bottom := c.Plot.Y + c.Plot.H
	// Slot a: "one" (1) sits on the axis, "two" (2) on top of it.
	a1, a2 := c.Bars[0], c.Bars[1]
	if math.Abs(a1.Y+a1.H-bottom) > 1e-9 || math.Abs(a2.Y+a2.H-a1.Y) > 1e-9 || math.Abs(a2.H-2*a1.H) > 1e-9 {
		t.Fatalf("slot a not stacked: %+v %+v (axis at %v)", a1.Rect, a2.Rect, bottom)
	}
	if a1.Text != "one, a: 1" || a2.Color != "#222" {
		t.Fatalf("bar text/colour: %q %q", a1.Text, a2.Color)
	}
	// The tallest stack (d: 7) fits under the top tick, which is the plot's top.
	top := c.YTicks[len(c.YTicks)-1]
	if top.Label != "8" || math.Abs(top.Pos-c.Plot.Y) > 1e-9 {
		t.Fatalf("top tick %+v, plot top %v", top, c.Plot.Y)
	}
	for _, b := range c.Bars {
		if b.Y < c.Plot.Y-1e-9 || b.Y+b.H > bottom+1e-9 || b.X < c.Plot.X || b.X+b.W > c.Plot.X+c.Plot.W {
			t.Fatalf("bar %+v outside the plot %+v", b.Rect, c.Plot)
		}
	}
	if len(c.XTicks) != 2 || c.XTicks[0].Label != "a" || c.XTicks[1].Label != "c" {
		t.Fatalf("x ticks %+v", c.XTicks)
	}
	if c.XTicks[0].Anchor != "middle" {
		t.Fatalf("x tick anchor %q", c.XTicks[0].Anchor)
	}
	// A label of the last of many slots would be cut at the right edge: it ends there instead.
	many := make([]string, 60)
	for i := range many {
		many[i] = fmt.Sprint(i)
	}
	edge := Build(Spec{Slots: many, TickAt: func(i int) bool { return i == 59 }}).XTicks[0]
	if edge.Anchor != "end" || edge.Pos != 360 {
		t.Fatalf("the last slot's label: %+v", edge)
	}
	if len(c.Legend) != 2 || c.Legend[1].Name != "two" || c.Legend[1].Line {
		t.Fatalf("legend %+v", c.Legend)
	}
}

// TestBuildLines: a dot per value, a path that breaks at the gap, the formatter in the titles.
func TestBuildLines(t *testing.T) {
	t.Parallel()
	nan := math.NaN()
	c := Build(Spec{ID: "l", Slots: []string{"a", "b", "c", "d"}, Format: func(v float64) string { return Label(v) + " ms" },
		Lines: []Series{{Name: "p95", Color: "#d55e00", Dash: "4 2", Values: []float64{10, 20, nan, 40}}}})
	if len(c.Lines) != 1 || len(c.Lines[0].Dots) != 3 {
		t.Fatalf("lines %+v", c.Lines)
	}
	if strings.Count(c.Lines[0].D, "M") != 2 || strings.Count(c.Lines[0].D, "L") != 1 {
		t.Fatalf("path %q: want two runs (a, b) and (d)", c.Lines[0].D)
	}
	if c.Lines[0].Dots[2].Text != "p95, d: 40 ms" || c.Lines[0].Dash != "4 2" {
		t.Fatalf("dot %+v", c.Lines[0].Dots[2])
	}
	if !c.Legend[0].Line {
		t.Fatal("a line's legend key is a swatch")
	}
	if e := Build(Spec{Slots: []string{"a"}, Lines: []Series{{Values: []float64{nan}}}}); !e.Empty || len(e.YTicks) == 0 {
		t.Fatalf("all-NaN chart: empty %v, ticks %v", e.Empty, e.YTicks)
	}
}

func TestMeter(t *testing.T) {
	t.Parallel()
	if m := NewMeter(4, 16, 10, 0, 200, 8); m.Fill.W != 50 || m.Track.W != 200 || m.Fill.X != 10 {
		t.Fatalf("4 of 16: %+v", m)
	}
	if m := NewMeter(40, 16, 0, 0, 200, 8); m.Fill.W != 200 {
		t.Fatalf("over the maximum: %+v", m)
	}
	if m := NewMeter(3, 0, 0, 0, 200, 8); m.Fill.W != 0 {
		t.Fatalf("no maximum: %+v", m)
	}
}
