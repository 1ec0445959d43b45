package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/access"
	"pitlane/internal/config"
	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/dbconn"
	"pitlane/web"
)

// The patrol's start waited for the migrations check (waitMigrated) with no bound: a check whose
// connection's host went silent (a failover that left the old host silent, the case
// dbconn.ConfigurePool and DatabaseClock.Run are bounded for) held it until TCP gave up — never,
// while the old host's kernel still acknowledged — though every new connection reached the
// database: /readyz answered 200 and the replica served, but it never swept (no heartbeat, no due
// session driven, no outbox; a review of a silent host). Each check is bounded (migratedBound).
// Negative control (run by hand): unbounded, no heartbeat in a minute.
func TestThePatrolStartsThoughItsMigrationCheckMetASilentHost(t *testing.T) {
	t.Parallel()
	direct := testdb.NewURL(t)
	proxied, proxy := testdb.FreezeVia(t, direct+"&default_query_exec_mode=exec", "goose_db_version")
	pcfg, err := pgxpool.ParseConfig(proxied)
	if err != nil {
		t.Fatal(err)
	}
	dbconn.ConfigurePool(pcfg) // as openPool
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(func(k string) string {
		return map[string]string{"HTTP_ADDR": "127.0.0.1:0", "SECRET_KEY": strings.Repeat("s", 32),
			"GATEWAY_URL": "http://127.0.0.1:1", "GATEWAY_API_KEY": "k", "REPLICA_ID": "silent-migrated",
			"SWEEP_INTERVAL": "50ms"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	base, stop := startServeWith(t, cfg, pool, slog.New(slog.NewTextHandler(io.Discard, nil)),
		serveOptions{clock: func(*payments.DatabaseClock) {}})
	t.Cleanup(func() { _ = stop(); closePool(pool, slog.New(slog.DiscardHandler)) })

	select {
	case <-proxy.Frozen():
	case <-time.After(60 * time.Second):
		t.Fatal("the migrations check never went out")
	}
	watch := testdb.Pool(t, direct)
	deadline := time.Now().Add(60 * time.Second) // a connect timeout, a lease, and plenty more
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		var n int
		if err := watch.QueryRow(context.Background(), `SELECT count(*) FROM sweeper_heartbeats WHERE replica_id = 'silent-migrated'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return
		}
		if time.Now().After(deadline) {
			res, err := http.Get(base + "/readyz")
			ready := "?"
			if err == nil {
				ready = res.Status
				res.Body.Close()
			}
			t.Fatalf("60 s after the migrations check's connection went silent (every new connection answers), the patrol has not started: no heartbeat; /readyz says %s", ready)
		}
		<-tick.C
	}
}

// A running replica whose database host goes silent (every connection open, no byte answered)
// answers /healthz at once, turns /readyz 503 within its probe bound, answers an API call 503
// problem+json within its request bound, and once the host answers again is ready, answers and
// beats again without a restart (a review of a silent host: held).
func TestASilentDatabaseIsAnsweredWithinBoundsAndOutlived(t *testing.T) {
	t.Parallel()
	direct := testdb.NewURL(t)
	watch := testdb.Pool(t, direct)
	_, apiKey, err := access.New(watch, nil).CreateAPIClient(context.Background(), payments.Staff{Email: "test@example.com", Role: "admin"}, "shop")
	if err != nil {
		t.Fatal(err)
	}
	proxied, proxy := viaProxy(t, direct, "")
	pcfg, err := pgxpool.ParseConfig(proxied)
	if err != nil {
		t.Fatal(err)
	}
	dbconn.ConfigurePool(pcfg)
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closePool(pool, slog.New(slog.DiscardHandler)) })
	t.Cleanup(proxy.release)
	cfg, err := config.Load(func(k string) string {
		return map[string]string{"HTTP_ADDR": "127.0.0.1:0", "SECRET_KEY": strings.Repeat("s", 32),
			"GATEWAY_URL": "http://127.0.0.1:1", "GATEWAY_API_KEY": "k", "REPLICA_ID": "silent-e2e",
			"GATEWAY_TIMEOUT": "100ms", "SWEEP_INTERVAL": "50ms"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	var synced <-chan struct{}
	base, stop := startServeWith(t, cfg, pool, slog.New(slog.NewTextHandler(io.Discard, nil)),
		serveOptions{clock: func(c *payments.DatabaseClock) { synced = c.Synced() }})
	t.Cleanup(func() { _ = stop() })
	<-synced
	type answer struct {
		status int
		ctype  string
		took   time.Duration
		err    error
	}
	client := &http.Client{Timeout: 2 * time.Minute}
	get := func(path string, auth bool) answer {
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		if auth {
			req.Header.Set("Authorization", "Bearer "+apiKey)
		}
		began := time.Now()
		res, err := client.Do(req)
		if err != nil {
			return answer{err: err, took: time.Since(began)}
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return answer{status: res.StatusCode, ctype: res.Header.Get("Content-Type"), took: time.Since(began)}
	}
	until := func(what string, ok func() bool) {
		deadline := time.Now().Add(30 * time.Second)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30 s", what)
			}
			<-tick.C
		}
	}
	payment := "/api/v1/payments/" + uuid.NewString()
	until("ready at start", func() bool { return get("/readyz", false).status == 200 })
	if a := get(payment, true); a.status != 404 {
		t.Fatalf("before the silence: %+v", a)
	}
	beat := func() (at time.Time) {
		_ = watch.QueryRow(context.Background(), `SELECT coalesce(max(beat_at), 'epoch') FROM sweeper_heartbeats WHERE replica_id = 'silent-e2e'`).Scan(&at)
		return at
	}

	proxy.stall()
	bound := web.RequestTimeoutFor(cfg.GatewayTimeout)
	var wg sync.WaitGroup
	answers := map[string]*answer{"healthz": {}, "readyz": {}, "api": {}}
	for name, path := range map[string]string{"healthz": "/healthz", "readyz": "/readyz", "api": payment} {
		wg.Add(1)
		go func() { defer wg.Done(); *answers[name] = get(path, name == "api") }()
	}
	wg.Wait()
	t.Logf("while silent: healthz %+v readyz %+v api %+v (request bound %s)", *answers["healthz"], *answers["readyz"], *answers["api"], bound)
	if a := answers["healthz"]; a.status != 200 || a.took > time.Second {
		t.Errorf("/healthz while the database is silent: %+v", a)
	}
	if a := answers["readyz"]; a.status != 503 || a.took > 5*time.Second {
		t.Errorf("/readyz while the database is silent: %+v, want 503 within its 2 s probe bound", a)
	}
	if a := answers["api"]; a.status != 503 || !strings.Contains(a.ctype, "problem+json") || a.took > bound+web.WriteMargin {
		t.Errorf("an API call while the database is silent: %+v, want 503 problem+json within %s", a, bound+web.WriteMargin)
	}

	silentBeat := beat()
	proxy.release()
	until("ready again", func() bool { return get("/readyz", false).status == 200 })
	until("the API answers again", func() bool { return get(payment, true).status == 404 })
	until("the patrol beats again", func() bool { return beat().After(silentBeat) })
}
