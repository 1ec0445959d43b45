package web_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"pitlane/internal/testdb"
	"pitlane/live"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/web"
)

// TestMetricsLiveListener: /metrics says whether this replica's live listener listens (0 before
// it connected, 1 once it does) and how many streams it serves.
func TestMetricsLiveListener(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	listening := make(chan struct{}, 1)
	hub := live.New(live.Config{ConnString: url, Logger: slog.New(slog.DiscardHandler), OnListen: func(uint32) { listening <- struct{}{} }})
	e := web.New(web.Deps{Logger: slog.New(slog.DiscardHandler), Live: hub,
		Payments: payments.NewService(testdb.Pool(t, url), payments.Config{Gateway: fakegw.New()})})
	scrape := func() string { return do(e, http.MethodGet, "/metrics").Body.String() }
	if body := scrape(); !strings.Contains(body, "\npitlane_live_listener_up 0\n") || !strings.Contains(body, "\npitlane_live_streams 0\n") {
		t.Fatalf("before the listener runs:\n%s", body)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		hub.Run(ctx)
	}()
	defer func() {
		cancel()
		<-ran
	}()
	select {
	case <-listening:
	case <-time.After(30 * time.Second):
		t.Fatal("the listener never listened")
	}
	sub, err := hub.Subscribe(live.Topic{Page: live.PageDashboard}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if body := scrape(); !strings.Contains(body, "\npitlane_live_listener_up 1\n") || !strings.Contains(body, "\npitlane_live_streams 1\n") {
		t.Fatalf("listening, one stream:\n%s", body)
	}
}
