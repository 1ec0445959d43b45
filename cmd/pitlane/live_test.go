package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"pitlane/access"
	"pitlane/internal/config"
	"pitlane/internal/testdb"
	"pitlane/payments"
)

// TestShutdownEndsLiveStreams: a console page's live stream is open when the server is told to
// stop. Graceful shutdown waits for connections to go idle, which a stream never does by
// itself: the server closes the streams when shutdown starts, the browser's stream ends
// cleanly, and the server returns without running into its grace period (which would make it
// report "graceful shutdown: context deadline exceeded").
func TestShutdownEndsLiveStreams(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := access.New(pool, nil).CreateUser(ctx, payments.Staff{Email: "cli:test"}, "ops@example.com", access.RoleSupport, "correct horse battery"); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(func(k string) string {
		return map[string]string{"HTTP_ADDR": "127.0.0.1:0", "SECRET_KEY": strings.Repeat("s", 32),
			"GATEWAY_URL": "http://127.0.0.1:1", "GATEWAY_API_KEY": "k"}[k] // no payment here needs the gateway
	})
	if err != nil {
		t.Fatal(err)
	}
	base, stop := startRun(t, cfg, pool)

	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	defer browser.CloseIdleConnections()
	resp, err := browser.Get(base + "/login")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`name="csrf_token"[^>]*value="([^"]+)"`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("no CSRF token on the sign-in page")
	}
	resp, err = browser.PostForm(base+"/login", url.Values{"email": {"ops@example.com"}, "password": {"correct horse battery"}, "csrf_token": {string(m[1])}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign in: %d", resp.StatusCode)
	}

	resp, err = browser.Get(base + "/live/dashboard")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	r := bufio.NewReader(resp.Body)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "retry: ") {
		t.Fatalf("stream's first line %q, %v", line, err)
	}

	ended := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, r)
		ended <- err
	}()
	if err := stop(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	select {
	case err := <-ended:
		if err != nil {
			t.Fatalf("the stream did not end cleanly: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the stream outlived the server")
	}
}

// TestDeployListenURLIsDirect: the environment example sends DATABASE_URL through pgbouncer
// (port 6432) and the live listener past it: LISTEN_DATABASE_URL is a URL pitlane accepts, on
// PostgreSQL's own port, and it is what the listener uses.
func TestDeployListenURLIsDirect(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../deploy/pitlane.env.example")
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && (k == "DATABASE_URL" || k == "LISTEN_DATABASE_URL") {
			vars[k] = v
		}
	}
	cfg, err := config.Load(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	listen, err := pgx.ParseConfig(cfg.ListenURL())
	if err != nil || cfg.ListenDatabaseURL == "" || listen.Port != 5432 {
		t.Fatalf("the example's listener URL %q (%v): want LISTEN_DATABASE_URL set, on port 5432", cfg.ListenURL(), err)
	}
	if pool, _ := pgx.ParseConfig(cfg.DatabaseURL); pool == nil || pool.Port != 6432 {
		t.Fatalf("the example's DATABASE_URL %q: want pgbouncer's port 6432", cfg.DatabaseURL)
	}
}
