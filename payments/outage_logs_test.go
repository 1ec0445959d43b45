package payments_test

import (
	"net"
	"syscall"

	"context"
	"github.com/jackc/pgx/v5"
	"log/slog"
	"strings"
	"testing"
	"time"

	"pitlane/internal/testdb"
	"pitlane/internal/testlog"
	"pitlane/payments"
)

// While the database is unavailable the patrol thins its errors to one a minute
// (TestPatrolLogsADatabaseOutageOnceAMinute), and so do RunSweeper's side loops: the events
// webhook's "events webhook" and the upkeep's "ops sample" were logged at ERROR on every pass,
// for as long as the outage lasted (a restart audit). Twenty passes log each at most twice.
func TestSideLoopsLogADatabaseOutageOnceAMinute(t *testing.T) {
	t.Parallel()
	var logs testlog.Buffer
	passes := make(chan struct{}, 100)
	svc := payments.NewService(testdb.Unreachable(t), payments.Config{ReplicaID: "replica-down",
		Logger:        slog.New(slog.NewTextHandler(&logs, nil)),
		SideLoopEvery: 10 * time.Millisecond,
		EventsWebhook: payments.EventsWebhook{URL: "http://127.0.0.1:1/events", Secrets: [][]byte{[]byte(strings.Repeat("e", 32))}},
		Hooks:         payments.Hooks{AfterUpkeep: func(context.Context) { passes <- struct{}{} }},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); svc.RunSweeper(ctx, 10*time.Millisecond) }()
	for range 20 {
		select {
		case <-passes:
		case <-time.After(30 * time.Second):
			t.Fatal("no upkeep pass")
		}
	}
	cancel()
	<-done
	out := logs.String()
	for _, msg := range []string{`msg="events webhook"`, `msg="ops sample"`} {
		if n := strings.Count(out, msg); n > 2 {
			t.Errorf("20 side-loop passes in a database outage logged %s %d times (the patrol logs such errors once a minute)", msg, n)
		}
	}
}

type downRow struct{}

func (downRow) Scan(...any) error {
	return &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
}

type downDB struct{ calls chan struct{} }

func (d downDB) QueryRow(context.Context, string, ...any) pgx.Row {
	d.calls <- struct{}{}
	return downRow{}
}

// The database clock's loop tries again every second while its reads fail, and logged a WARN
// each time: 3,600 lines an hour of outage per replica (a restart audit). Now once a minute
// while it fails: twenty failed reads in a row log at most twice.
func TestTheClockLogsADatabaseOutageOnceAMinute(t *testing.T) {
	t.Parallel()
	var logs testlog.Buffer
	c := payments.NewDatabaseClock(nil)
	db := downDB{calls: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx, db, 10*time.Millisecond, slog.New(slog.NewTextHandler(&logs, nil)))
	}()
	for range 20 {
		<-db.calls
	}
	cancel()
	go func() {
		for range db.calls {
		}
	}()
	<-done
	close(db.calls)
	if n := strings.Count(logs.String(), `clock: could not read`); n > 2 {
		t.Errorf("20 failed reads of the database's clock logged %d warnings (the patrol logs such errors once a minute)", n)
	}
}
