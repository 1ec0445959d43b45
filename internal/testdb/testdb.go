// Package testdb is the test bench: every database test gets its own database cloned from a
// template that the embedded migrations built once per schema version (peterldowns/pgtestdb).
//
// The cluster comes from TEST_DATABASE_URL, which `make test` exports after starting one
// throwaway PostgreSQL for the run. Without it a database test FAILS with instructions: it never
// skips, so a green run always means the database tests ran.
package testdb

import (
	"context"
	"database/sql"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver pgtestdb uses
	"github.com/peterldowns/pgtestdb"

	"pitlane/migrations"
	"pitlane/payments/dbconn"
)

// EnvURL names the variable that points the tests at a PostgreSQL cluster.
const EnvURL = "TEST_DATABASE_URL"

type migrator struct{}

func (migrator) Hash() (string, error) { return migrations.Hash() }

func (migrator) Migrate(ctx context.Context, db *sql.DB, _ pgtestdb.Config) error {
	_, err := migrations.Up(ctx, db)
	return err
}

// ServerURL returns TEST_DATABASE_URL or fails the test with how to get one.
func ServerURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(EnvURL)
	if u == "" {
		t.Fatalf("this test needs PostgreSQL: run `make test` or set %s (e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable)", EnvURL)
	}
	return u
}

func config(t testing.TB) pgtestdb.Config {
	t.Helper()
	raw := ServerURL(t)
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("%s is not a URL: %v", EnvURL, err)
	}
	pw, _ := u.User.Password()
	q := u.Query()
	host := u.Hostname()
	if host == "" { // unix socket: postgres:///db?host=/path
		host = q.Get("host")
	}
	q.Del("host")
	if q.Get("sslmode") == "" {
		q.Set("sslmode", "disable")
	}
	return pgtestdb.Config{
		DriverName:                "pgx",
		Host:                      host,
		Port:                      u.Port(),
		User:                      u.User.Username(),
		Password:                  pw,
		Database:                  strings.TrimPrefix(u.Path, "/"),
		Options:                   q.Encode(),
		ForceTerminateConnections: true,
	}
}

// NewURL creates a fresh migrated database for this test and returns its URL. The database is
// dropped when the test ends.
func NewURL(t testing.TB) string {
	t.Helper()
	conf := pgtestdb.Custom(t, config(t), migrator{})
	return conf.URL()
}

// NewEmptyURL creates a fresh database with no migrations applied (for migration tests).
func NewEmptyURL(t testing.TB) string {
	t.Helper()
	conf := pgtestdb.Custom(t, config(t), pgtestdb.NoopMigrator{})
	return conf.URL()
}

// Pool opens a pgx pool on url, closed when the test ends. Two pools on one URL behave like two
// replicas: separate connections, separate sessions.
func Pool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("testdb: parse %q: %v", url, err)
	}
	cfg.MaxConns = 20
	dbconn.ConfigurePool(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("testdb: connect: %v", err)
	}
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("testdb: ping: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// PoolOf opens a pool of at most maxConns connections on pool's database (its settings
// otherwise), closed when the test ends: a replica whose DATABASE_URL says
// pool_max_conns=maxConns, or one whose pool a flood has taken all of.
func PoolOf(t testing.TB, pool *pgxpool.Pool, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg := pool.Config().Copy()
	cfg.MaxConns = maxConns
	cfg.MinConns = 0
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("testdb: pool of %d: %v", maxConns, err)
	}
	t.Cleanup(p.Close)
	return p
}

// New is the common case: a fresh migrated database and a pool on it.
func New(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return Pool(t, NewURL(t))
}

// Unreachable is a pool on an address where nothing listens (a port just given back by the
// kernel): every query fails at once with a refused connection, the database outage the
// server turns into 503. For tests of what a server does before and without its database
// (security headers, the route table, spans) — the server itself always has one.
func Unreachable(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testdb: unreachable: %v", err)
	}
	addr := ln.Addr().String()
	ln.Close()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@"+addr+"/x?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatalf("testdb: unreachable: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}
