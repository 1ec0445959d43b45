package main

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"pitlane/internal/config"
	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/web"
)

// serve's gateway is read under its metrics (and traces): an answer the core finds unreadable
// (here a registration whose id carries a NUL: no column stores it) is counted as the unknown
// failure the core acts on. NewService read it above them, so the metric counted "ok" while the
// session went Unknown, and an answer that stayed unreadable at every look looked healthy to
// the gateway error-ratio alert (a review of readableAnswers). Negative control: without
// payments.Readable in newService, the outcome is "ok".
func TestAnUnreadableAnswerIsCountedAsTheCoreActsOnIt(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"gp_\u0000x","status":"pending","amount":100,"currency":"EUR"}`))
	}))
	defer gw.Close()
	cfg, err := config.Load(func(k string) string {
		return map[string]string{"SECRET_KEY": strings.Repeat("s", 32), "GATEWAY_URL": gw.URL, "GATEWAY_API_KEY": "k"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	metrics := web.NewMetrics()
	svc, _, err := newService(cfg, pool, nil, slog.New(slog.DiscardHandler), metrics, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := svc.Create(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"},
		payments.CreateInput{OrderID: "o-unreadable", Amount: 100, Currency: "EUR"})
	if err != nil || r.Session.Status != payments.StatusUnknown {
		t.Fatalf("create: %+v %v; want Unknown", r.Session, err)
	}
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var outcomes []string
	for _, mf := range mfs {
		if mf.GetName() != "pitlane_gateway_calls_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["op"] == "register" {
				outcomes = append(outcomes, l["outcome"])
			}
		}
	}
	if strings.Join(outcomes, ",") != "unknown" {
		t.Errorf("pitlane_gateway_calls_total{op=register} outcomes %v for an answer the core read as unknown; want [unknown]", outcomes)
	}
}
