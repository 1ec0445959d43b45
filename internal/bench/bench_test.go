package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"pitlane/internal/testdb"
)

// TestBenchSmall runs the benchmark program small, once, on the test cluster (make test): it
// proves every figure still runs end to end and writes a well-formed report. It judges no
// verdict and asserts no time: the figures of a loaded test machine mean nothing.
func TestBenchSmall(t *testing.T) {
	testdb.ServerURL(t) // fails with instructions without a cluster
	var log bytes.Buffer
	env := &Env{Scale: "small", Log: &log, Getenv: func(string) string { return "" },
		newDB: func(_ context.Context, migrate bool) (string, error) {
			if migrate {
				return testdb.NewURL(t), nil
			}
			return testdb.NewEmptyURL(t), nil
		}}
	rep, err := measure(context.Background(), env, figures)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, log.String())
	}
	if len(rep.Figures) == 0 {
		t.Fatal("no figures")
	}
	names := map[string]bool{}
	for _, f := range rep.Figures {
		if f.Name == "" || f.Unit == "" || f.Anchor == "" || f.Value < 0 || f.AnchorValue < 0 || names[f.Name] {
			t.Errorf("figure %+v: every figure needs a unique name, a unit and an anchor", f)
		}
		if (f.MinRatio > 0 || f.MaxRatio > 0) && (f.Value <= 0 || f.AnchorValue <= 0) {
			t.Errorf("figure %+v: a ratio target needs a measured value and anchor", f)
		}
		if f.Target() == "none" && !f.ReportOnly && !strings.Contains(f.Name, "vs ideal") {
			t.Errorf("figure %q has no target", f.Name)
		}
		names[f.Name] = true
	}
	// Every figure function of the program ran and reported (issue 12's table, issue 10's drain).
	for _, want := range []string{"create, distinct orders", "create sweep, C=2", "create sweep, each side", "clicks on one hot order", "duplicate storm", "idempotency key overhead",
		"lock independence", "API Create over HTTP", "resident memory", "console at", "sweeper drain"} {
		found := false
		for name := range names {
			found = found || strings.HasPrefix(name, want)
		}
		if !found {
			t.Errorf("no figure %q in the report", want)
		}
	}
	var table bytes.Buffer
	rep.Print(&table, false)
	if strings.Contains(table.String(), "verdict") {
		t.Error("the small run prints verdicts")
	}
	path := filepath.Join(t.TempDir(), "bench", "report.json")
	if err := rep.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	if err := json.Unmarshal(raw, &rows); err != nil || len(rows) != len(rep.Figures) {
		t.Fatalf("report.json: %v, %d rows\n%s", err, len(rows), raw)
	}
	for _, key := range []string{"name", "value", "unit", "anchor", "anchor_value", "ratio", "target", "verdict"} {
		if _, ok := rows[0][key]; !ok {
			t.Errorf("report.json rows lack %q: %s", key, raw)
		}
	}
	if v := rows[0]["verdict"]; v != "ok" && v != "short" {
		t.Errorf("verdict %v", v)
	}
	t.Logf("small run (not judged):\n%s", table.String())
}

// A figure name that is no figure stops the run before it starts (a typo would otherwise run
// nothing and write an empty report); names run in the program's order, each once.
func TestBenchFiguresNamesAreChecked(t *testing.T) {
	if _, err := selected("create,craete"); err == nil || !strings.Contains(err.Error(), `"craete"`) || !strings.Contains(err.Error(), "clicks") {
		t.Errorf("an unknown figure: %v", err)
	}
	got, err := selected(" clicks,create,clicks")
	if err != nil || strings.Join(names(got), ",") != "create,clicks" {
		t.Errorf("selected: %v %v", names(got), err)
	}
	var stderr bytes.Buffer
	env := map[string]string{"BENCH_FIGURES": "nope"}
	if code := run(context.Background(), func(k string) string { return env[k] }, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), `"nope"`) {
		t.Errorf("run with an unknown figure: exit %d, %s", code, stderr.String())
	}
}

// The report goes out as JSON and as Markdown that says which run it is; a full run is kept as
// last-full.* and a later partial run leaves that copy alone (docs/performance.md's "Last full
// run" table is copied from it).
func TestBenchReportKeepsTheLastFullRun(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "report.json")
	meta := RunMeta{Started: time.Date(2026, 12, 2, 0, 19, 0, 0, time.UTC), Finished: time.Date(2026, 12, 2, 0, 44, 0, 0, time.UTC),
		Commit: "abc1234", Scale: "full", Cores: 2, PostgreSQL: "15.18", Figures: []string{"create", "clicks"}}
	full := Report{Figures: []Figure{
		{Name: "create | C=4", Value: 1111.4, Unit: "creates/s", Anchor: "pgbench", AnchorValue: 1419, MinRatio: 0.8},
		{Name: "growth", Value: 3.25, Unit: "MB", Anchor: "flat", MaxValue: bound(30)},
	}}
	written, err := full.Write(path, meta, true, true)
	if err != nil || len(written) != 4 {
		t.Fatalf("full run wrote %v: %v", written, err)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "last-full.md"))
	for _, want := range []string{"2026-12-02 00:19–00:44 UTC, commit abc1234, 2 CPU cores", "| create \\| C=4 | 1,111 | creates/s | pgbench | 1,419 | 0.783 | >= 0.80 | short |",
		"| growth | 3.25 | MB | flat | — | — | value <= 30 | ok |"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("last-full.md lacks %q:\n%s", want, md)
		}
	}
	partial := Report{Figures: full.Figures[1:]}
	meta.Figures = []string{"clicks"}
	if written, err = partial.Write(path, meta, true, false); err != nil || len(written) != 2 {
		t.Fatalf("partial run wrote %v: %v", written, err)
	}
	var rows []row
	for file, want := range map[string]int{"report.json": 1, "last-full.json": 2} {
		raw, _ := os.ReadFile(filepath.Join(dir, file))
		if err := json.Unmarshal(raw, &rows); err != nil || len(rows) != want {
			t.Errorf("%s: %d rows, want %d (%v)", file, len(rows), want, err)
		}
	}
	if md, _ := os.ReadFile(filepath.Join(dir, "report.md")); !strings.Contains(string(md), "figures: clicks.") {
		t.Errorf("report.md is not the partial run's:\n%s", md)
	}
}
