package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"
)

// Figure is one measured number beside its anchor: what a reader needs to tell whether the
// number is good on this machine, in this run. Machines are noisy, so every judgement is a ratio
// taken in the same run on the same private PostgreSQL; nothing here asserts a time.
type Figure struct {
	Name        string  // e.g. "sweeper drain 200ms ×2 vs ideal"
	Value       float64 // what pitlane did
	Unit        string  // e.g. "sessions/s"
	Anchor      string  // what it is compared with, e.g. "ideal replicas × concurrency / latency"
	AnchorValue float64
	// Target: the figure is ok when Value/AnchorValue ≥ MinRatio (when MinRatio > 0) and
	// ≤ MaxRatio (when MaxRatio > 0). No bound: reported only.
	MinRatio float64
	MaxRatio float64
	// Absolute bounds, for targets that are not a ratio ("duplicates' p99 < 100 ms", "growth
	// < 30 MB", "no sequential scan"): Value ≤ MaxValue, Value ≥ MinValue, and
	// Value − AnchorValue ≤ MaxOverAnchor, each when set.
	MaxValue      *float64
	MinValue      *float64
	MaxOverAnchor *float64
	// ReportOnly marks a figure that carries no target on purpose: a capacity figure (replicas on
	// one PostgreSQL, docs/scaling.md) or a curve point beside the judged one.
	ReportOnly bool
}

// bound makes an absolute bound of a Figure.
func bound(v float64) *float64 { return &v }

// Ratio is Value / AnchorValue (0 without an anchor).
func (f Figure) Ratio() float64 {
	if f.AnchorValue == 0 {
		return 0
	}
	return f.Value / f.AnchorValue
}

// Target says the bound in words ("≥ 0.80", "≤ 1.10", "none").
func (f Figure) Target() string {
	var parts []string
	if f.MinRatio > 0 {
		parts = append(parts, fmt.Sprintf(">= %.2f", f.MinRatio))
	}
	if f.MaxRatio > 0 {
		parts = append(parts, fmt.Sprintf("<= %.2f", f.MaxRatio))
	}
	if f.MinValue != nil {
		parts = append(parts, fmt.Sprintf("value >= %g", *f.MinValue))
	}
	if f.MaxValue != nil {
		parts = append(parts, fmt.Sprintf("value <= %g", *f.MaxValue))
	}
	if f.MaxOverAnchor != nil {
		parts = append(parts, fmt.Sprintf("value - anchor <= %g", *f.MaxOverAnchor))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " and ")
}

// Verdict is "ok" when the ratio meets the target (or there is none), "short" otherwise.
func (f Figure) Verdict() string {
	r := f.Ratio()
	if (f.MinRatio > 0 && r < f.MinRatio) || (f.MaxRatio > 0 && r > f.MaxRatio) {
		return "short"
	}
	if (f.MinValue != nil && f.Value < *f.MinValue) || (f.MaxValue != nil && f.Value > *f.MaxValue) ||
		(f.MaxOverAnchor != nil && f.Value-f.AnchorValue > *f.MaxOverAnchor) {
		return "short"
	}
	return "ok"
}

// row is one entry of report.json.
type row struct {
	Name        string  `json:"name"`
	Value       float64 `json:"value"`
	Unit        string  `json:"unit"`
	Anchor      string  `json:"anchor"`
	AnchorValue float64 `json:"anchor_value"`
	Ratio       float64 `json:"ratio"`
	Target      string  `json:"target"`
	Verdict     string  `json:"verdict"`
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// Report is every figure of one run, in the order measured.
type Report struct {
	Figures []Figure
}

func (r Report) rows() []row {
	out := make([]row, len(r.Figures))
	for i, f := range r.Figures {
		out[i] = row{Name: f.Name, Value: round(f.Value, 2), Unit: f.Unit, Anchor: f.Anchor,
			AnchorValue: round(f.AnchorValue, 2), Ratio: round(f.Ratio(), 3), Target: f.Target(), Verdict: f.Verdict()}
	}
	return out
}

// Print writes the table people read. judge=false leaves the verdict column out (make test runs
// the small version only to prove the program works; a verdict there would mean nothing).
func (r Report) Print(w io.Writer, judge bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	head := "figure\tvalue\tunit\tanchor\tanchor value\tratio\ttarget\t"
	if judge {
		head += "verdict\t"
	}
	fmt.Fprintln(tw, head)
	for _, x := range r.rows() {
		line := fmt.Sprintf("%s\t%.2f\t%s\t%s\t%.2f\t%.3f\t%s\t", x.Name, x.Value, x.Unit, x.Anchor, x.AnchorValue, x.Ratio, x.Target)
		if judge {
			line += x.Verdict + "\t"
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
}

// WriteJSON writes report.json (creating its directory).
func (r Report) WriteJSON(path string) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // ">= 0.80" stays readable
	enc.SetIndent("", "  ")
	if err := enc.Encode(r.rows()); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return writeFile(path, b.Bytes())
}

func writeFile(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

// RunMeta says which run a report is of: what a table copied into docs/performance.md needs
// beside it (a table without its commit and machine cannot be told from another run's).
type RunMeta struct {
	Started, Finished time.Time
	Commit            string // the source's commit, "+dirty" when it had local changes
	Scale             string
	Cores             int
	PostgreSQL        string
	Figures           []string // the figure functions run (BENCH_FIGURES)
}

// Markdown writes the run's table as Markdown under a line saying which run it is.
func (r Report) Markdown(w io.Writer, m RunMeta, judge bool) {
	fmt.Fprintf(w, "`make bench` at scale %s, %s–%s UTC, commit %s, %d CPU cores, PostgreSQL %s (private, fsync off); figures: %s.\n\n",
		m.Scale, m.Started.Format("2006-01-02 15:04"), m.Finished.Format("15:04"), m.Commit, m.Cores, m.PostgreSQL, strings.Join(m.Figures, ", "))
	cols := []string{"figure", "value", "unit", "anchor", "anchor value", "ratio", "target"}
	if judge {
		cols = append(cols, "verdict")
	}
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(cols, " | "), strings.Repeat("---|", len(cols)))
	cell := strings.NewReplacer("|", `\|`, "\n", " ").Replace
	for _, x := range r.rows() {
		anchorValue, ratio := "—", "—"
		if x.AnchorValue != 0 {
			anchorValue, ratio = number(x.AnchorValue), fmt.Sprintf("%.3f", x.Ratio)
		}
		cells := []string{cell(x.Name), number(x.Value), cell(x.Unit), cell(x.Anchor), anchorValue, ratio, cell(x.Target)}
		if judge {
			cells = append(cells, x.Verdict)
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
}

// number writes a figure for people: whole numbers with thousands separators from 100 up, two
// decimals below.
func number(v float64) string {
	if math.Abs(v) < 100 {
		return fmt.Sprintf("%.2f", v)
	}
	digits := fmt.Sprintf("%.0f", math.Abs(v))
	var b strings.Builder
	if v < 0 {
		b.WriteByte('-')
	}
	for i, d := range digits {
		if i > 0 && (len(digits)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(d)
	}
	return b.String()
}

// Write writes the report as JSON to path and as Markdown beside it (report.md), and returns the
// files written. full (scale full, every figure) also keeps both as last-full.json and
// last-full.md in the same directory: the last full run stays at hand when a partial run
// (BENCH_FIGURES) or a small one writes report.json after it.
func (r Report) Write(path string, m RunMeta, judge, full bool) ([]string, error) {
	var md bytes.Buffer
	r.Markdown(&md, m, judge)
	mdPath := strings.TrimSuffix(path, ".json") + ".md"
	written := []string{path, mdPath}
	if err := r.WriteJSON(path); err != nil {
		return nil, err
	}
	if err := writeFile(mdPath, md.Bytes()); err != nil {
		return nil, err
	}
	if full {
		dir := filepath.Dir(path)
		if err := r.WriteJSON(filepath.Join(dir, "last-full.json")); err != nil {
			return nil, err
		}
		if err := writeFile(filepath.Join(dir, "last-full.md"), md.Bytes()); err != nil {
			return nil, err
		}
		written = append(written, filepath.Join(dir, "last-full.json"), filepath.Join(dir, "last-full.md"))
	}
	return written, nil
}
