package web_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/web"
)

// The database answers but refuses every write — what a replica
// sees when its DATABASE_URL (or pgbouncer's host) reaches a standby, or an old primary that came
// back as one, during a failover. Nothing can be served: every create, check, sign-in and patrol
// claim fails. /readyz is the balancer's "can requests routed here be served" and the runbooks'
// first look (PitlaneStatsUnavailable: "/readyz of the replicas (its reason)"); it answers 200,
// and the core reported the writes as internal errors (500, "bugs" in PitlaneHTTPErrors' runbook:
// "roll back the last deploy"), not as the database being unavailable (503) (observability
// review, session 32). /readyz says "read-only" now, and SQLSTATE 25006 is an outage.
// Negative control: the old Ping and error mapping fail both checks.
func TestReadyzAndErrorsOnAReadOnlyDatabase(t *testing.T) {
	primary := testdb.New(t)
	cfg := primary.Config().Copy()
	cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on" // a hot standby answers like this
	ro, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	svc := payments.NewService(ro, payments.Config{Gateway: fakegw.New(), ReplicaID: "replica-ro", LockTimeout: 10 * time.Second})
	e := web.New(web.Deps{Logger: slog.New(slog.DiscardHandler), DB: ro, ReplicaID: "replica-ro", Payments: svc})

	_, cerr := svc.Create(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "t"},
		payments.CreateInput{OrderID: "ro-1", Amount: 100, Currency: "EUR"})
	metrics := do(e, http.MethodGet, "/metrics").Body.String()
	rec := do(e, http.MethodGet, "/readyz")
	t.Logf("create: %v (code %s); /readyz %d %s; stats_up 0: %v", cerr, payments.ErrorCode(cerr), rec.Code, strings.TrimSpace(rec.Body.String()),
		strings.Contains(metrics, "pitlane_stats_up 0\n"))
	if rec.Code == http.StatusOK {
		t.Errorf("/readyz = 200 on a database that refuses every write (a create failed: %v)", cerr)
	}
	if code := payments.ErrorCode(cerr); code != payments.EUNAVAIL {
		t.Errorf("a create on a read-only database is %q (HTTP 500, a bug per the runbook), want %q (503, the database)", code, payments.EUNAVAIL)
	}
}
