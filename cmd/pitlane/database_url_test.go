package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"pitlane/internal/testdb"
	"pitlane/payments/dbconn"
)

// withPoolSettings is url with pgxpool's own settings added: what the README tells operators to
// put in DATABASE_URL ("raise pool_max_conns").
func withPoolSettings(url string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "pool_max_conns=8&pool_min_conns=1"
}

// The contract's DATABASE_URL is pgx syntax and the README has operators raise pool_max_conns in
// it; serve took such a URL, but `pitlane migrate` (and so `pitlane dev` with a DATABASE_URL)
// opened it as a plain connection, which sent pool_max_conns to PostgreSQL as a run-time
// parameter: "unrecognized configuration parameter", exit 1. Outside review (contract).
func TestMigrateTakesTheURLServeTakes(t *testing.T) {
	t.Parallel()
	url := withPoolSettings(testdb.NewEmptyURL(t))
	if out, err := pitlane(map[string]string{"DATABASE_URL": url}, "migrate").CombinedOutput(); err != nil {
		t.Fatalf("pitlane migrate with pool settings in DATABASE_URL: %v\n%s", err, out)
	}
}

// The contract: serve "refuses to start without it [SECRET_KEY] and names the variable". With
// DATABASE_URL alone it named GATEWAY_URL (checked first), not the contract's variable.
func TestServeWithoutSecretKeyNamesIt(t *testing.T) {
	t.Parallel()
	var stdout, stderr strings.Builder
	env := &Env{Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr,
		Getenv: func(k string) string {
			return map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/x"}[k]
		}}
	if code := Main([]string{"serve"}, env); code != 2 || !strings.Contains(stderr.String(), "SECRET_KEY") {
		t.Fatalf("serve without SECRET_KEY: exit %d, stderr %q; want exit 2 naming SECRET_KEY", code, stderr.String())
	}
}

// `pitlane migrate` against a host that accepts the connection and never answers (a hung
// database host, a black-holing firewall) fails within dbconn.ConnectTimeout, naming the host;
// before, it waited silently until someone killed it (an outside review).
func TestMigrateOnASilentHostFails(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() }) // held open, never answered
		}
	}()
	done := make(chan error, 1)
	go func() {
		_, err := migrate(context.Background(), "postgres://pitlane@"+ln.Addr().String()+"/pitlane?sslmode=disable")
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "connect to database at 127.0.0.1") {
			t.Fatalf("migrate on a silent host: %v, want a connect error naming the host", err)
		}
	case <-time.After(dbconn.ConnectTimeout + time.Minute):
		t.Fatal("migrate on a silent host still waits")
	}
}
