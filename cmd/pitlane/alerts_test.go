package main

// Checks of deploy/prometheus and deploy/grafana: the rules pass promtool, behave as their unit
// tests say, each has its runbook, and every metric they and the dashboard name is one a real
// pitlane server exports.

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	"pitlane/access"
	"pitlane/internal/config"
	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/gatewaysim"
)

const (
	rulesPath     = "../../deploy/prometheus/pitlane.rules.yml"
	rulesTestPath = "../../deploy/prometheus/pitlane.rules.test.yml"
	dashboardPath = "../../deploy/grafana/pitlane-dashboard.json"
	runbooksPath  = "../../docs/operations.md"
)

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	raw, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatalf("%s: %v", rulesPath, err)
	}
	return f
}

// dashboardExprs returns every PromQL expression of the Grafana dashboard (panel targets and
// annotation queries), whatever their nesting.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && k == "expr" {
					out = append(out, s)
					continue
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(doc)
	return out
}

// promtool finds promtool (make test exports PROMTOOL_BIN; Debian's prometheus package has it).
func promtool(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("PROMTOOL_BIN"); p != "" {
		return p
	}
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: run `make test` (it installs it) or `apt-get install -y prometheus`")
	}
	return p
}

// TestAlertRulesPromtool: `promtool check rules` accepts the rules, `promtool test rules` runs
// their unit tests green, every alert has a unit test that sees it fire, and every alert's
// runbook_url names a runbook heading of docs/operations.md.
func TestAlertRulesPromtool(t *testing.T) {
	t.Parallel()
	bin := promtool(t)
	for _, args := range [][]string{{"check", "rules", rulesPath}, {"test", "rules", rulesTestPath}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "SUCCESS") {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	rawTests, err := os.ReadFile(rulesTestPath)
	if err != nil {
		t.Fatal(err)
	}
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `yaml:"alertname"`
				ExpAlerts []map[string]any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(rawTests, &tests); err != nil {
		t.Fatal(err)
	}
	seenFiring := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				seenFiring[a.Alertname] = true
			}
		}
	}
	runbooks, err := os.ReadFile(runbooksPath)
	if err != nil {
		t.Fatal(err)
	}
	headings := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#{2,4} +(.+?)\s*$`).FindAllStringSubmatch(string(runbooks), -1) {
		headings["docs/operations.md#"+githubAnchor(m[1])] = true
	}
	alerts := 0
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			if !seenFiring[r.Alert] {
				t.Errorf("%s: no unit test in %s sees it fire", r.Alert, filepath.Base(rulesTestPath))
			}
			if url := r.Annotations["runbook_url"]; !headings[url] {
				t.Errorf("%s: runbook_url %q is no heading of docs/operations.md", r.Alert, url)
			}
			if r.Labels["severity"] != "critical" && r.Labels["severity"] != "warning" {
				t.Errorf("%s: severity %q, want critical or warning", r.Alert, r.Labels["severity"])
			}
		}
	}
	if alerts < 7 {
		t.Errorf("%d alerts, want at least the seven of issue 14", alerts)
	}
}

// githubAnchor is the anchor GitHub gives a Markdown heading: lower case, spaces to hyphens,
// punctuation dropped.
func githubAnchor(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	var b strings.Builder
	for _, r := range h {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || ('a' <= r && r <= 'z') || ('0' <= r && r <= '9'):
			b.WriteRune(r)
		}
	}
	return b.String()
}

var (
	metricRe   = regexp.MustCompile(`\b((?:pitlane|go|process)_[a-zA-Z0-9_]+)\b(\s*\{[^}]*\})?`)
	matcherRe  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"`)
	histSuffix = regexp.MustCompile(`_(bucket|sum|count)$`)
)

// TestRulesAndDashboardNameExportedMetrics: every metric the alert rules and the Grafana
// dashboard name (and every label their selectors match on) is one a real pitlane server
// exports with samples, read from its live /metrics after exercising it: an API payment through
// the reference-gateway simulator, the patrol sweeping, a session stuck past its settle time and
// one whose schedule ran out (a finance case, a flagged session). A renamed metric or label
// would leave an alert that never fires; this catches it.
func TestRulesAndDashboardNameExportedMetrics(t *testing.T) {
	t.Parallel()
	type use struct{ where, expr string }
	uses := map[string][]use{}   // metric → where it is used
	labels := map[string][]use{} // metric + "\x00" + label → where
	add := func(where, expr string) {
		for _, m := range metricRe.FindAllStringSubmatch(expr, -1) {
			uses[m[1]] = append(uses[m[1]], use{where, expr})
			for _, l := range matcherRe.FindAllStringSubmatch(m[2], -1) {
				if l[1] == "job" || l[1] == "instance" {
					continue // Prometheus adds these target labels when it scrapes
				}
				labels[m[1]+"\x00"+l[1]] = append(labels[m[1]+"\x00"+l[1]], use{where, expr})
			}
		}
	}
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			add("rule "+r.Alert, r.Expr)
		}
	}
	for _, e := range dashboardExprs(t) {
		add("dashboard", e)
	}
	if len(uses) < 15 {
		t.Fatalf("only %d metrics named by the rules and the dashboard: is the extraction broken? %v", len(uses), uses)
	}

	families := liveMetrics(t)
	for name, where := range uses {
		fam := families[name]
		if fam == nil {
			if base := histSuffix.ReplaceAllString(name, ""); base != name {
				if f := families[base]; f != nil && (f.GetType() == dto.MetricType_HISTOGRAM || f.GetType() == dto.MetricType_SUMMARY) {
					fam = f
				}
			}
		}
		if fam == nil {
			t.Errorf("%s is not exported by pitlane (used by %s: %s)", name, where[0].where, where[0].expr)
			continue
		}
		if len(fam.GetMetric()) == 0 {
			t.Errorf("%s has no samples after exercising the server (used by %s)", name, where[0].where)
			continue
		}
		for key, lw := range labels {
			metric, label, _ := strings.Cut(key, "\x00")
			if metric != name {
				continue
			}
			found := false
			for _, m := range fam.GetMetric() {
				for _, lp := range m.GetLabel() {
					found = found || lp.GetName() == label
				}
			}
			if !found {
				t.Errorf("%s has no label %q (matched on by %s: %s)", name, label, lw[0].where, lw[0].expr)
			}
		}
	}
}

// liveMetrics runs a real server (the process serve builds, on a free port, in front of the
// reference-gateway simulator), exercises it and returns its /metrics parsed.
func liveMetrics(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	pool := testdb.New(t)
	sim := gatewaysim.New(gatewaysim.Options{APIKey: "gw-test-key"})
	simSrv := httptest.NewServer(sim)
	t.Cleanup(func() {
		simSrv.Close()
		sim.Close() //nolint:errcheck
	})
	cfg, err := config.Load(func(k string) string {
		return map[string]string{"HTTP_ADDR": "127.0.0.1:0", "GATEWAY_URL": simSrv.URL, "GATEWAY_API_KEY": "gw-test-key",
			"SECRET_KEY": strings.Repeat("s", 32), "SWEEP_INTERVAL": "100ms", "REPLICA_ID": "metrics-live"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, apiKey, err := access.New(pool, nil).CreateAPIClient(ctx, payments.Staff{Email: "test@example.com", Role: "admin"}, "shop")
	if err != nil {
		t.Fatal(err)
	}
	base, stop := startRun(t, cfg, pool)
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("server: %v", err)
		}
	}()

	stuck := createPayment(t, base, apiKey, "metrics-stuck", `{"amount":1999,"currency":"EUR"}`, "")
	exhausted := createPayment(t, base, apiKey, "metrics-exhausted", `{"amount":500,"currency":"USD"}`, "")
	// One session past its expected settle time (stuck money) and one whose sweeper schedule is
	// at its last step and due now: the patrol's next look runs it out (flagged, a case).
	if _, err := pool.Exec(ctx, `UPDATE payment_sessions SET created_at = created_at - interval '1 hour' WHERE id = $1`, stuck); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE payment_sessions SET check_attempts = $2, next_check_at = now() WHERE id = $1`,
		exhausted, len(payments.DefaultBackoff)-1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the patrol to run the schedule out (a sweep_exhausted case)", func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = $2`, exhausted, payments.CaseSweepExhausted).Scan(&n)
		return err == nil && n == 1
	})
	// The scrape counts afresh rather than reading a count from before the exercise.
	if _, err := pool.Exec(ctx, `UPDATE stats_cache SET refreshed_at = '-infinity'`); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics = %d", resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	for _, want := range []string{`pitlane_stuck_amount{currency="EUR"} 1999`, `pitlane_finance_cases_open{kind="sweep_exhausted"} 1`,
		`pitlane_sessions_flagged 1`, `pitlane_stats_up 1`} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("/metrics lacks %q after the exercise", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
	names := make([]string, 0, len(families))
	for n := range families {
		names = append(names, n)
	}
	slices.Sort(names)
	t.Logf("%d metric families exported", len(names))
	return families
}

// waitFor re-reads cond (a database condition a running server brings about, one query a read,
// as the race tests watch pg_locks) until it holds, and fails the test after 30 s: a wait for an
// event, never a timed assertion.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
