package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
