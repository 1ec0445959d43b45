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
	for _, f := range rep.Figures {
		if f.Value <= 0 || f.AnchorValue <= 0 || f.Name == "" || f.Unit == "" || f.Anchor == "" {
			t.Errorf("figure %+v: every figure needs a value and an anchor", f)
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
