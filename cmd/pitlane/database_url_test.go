package main

import (
	"strings"
	"testing"

	"pitlane/internal/testdb"
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
