package payments

import (
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"

	"pitlane/internal/testdb"
	"pitlane/internal/testlog"
)

// One loop's outage-classified error (here the ops sample's one reset connection) must not hide
// another loop's first error of a later outage: the patrol's first line is what an operator (and
// a log alert) sees when the database goes away.
func TestOneLoopsOutageLineDoesNotHideAnothersFirst(t *testing.T) {
	t.Parallel()
	var logs testlog.Buffer
	s := NewService(testdb.Unreachable(t), Config{ReplicaID: "r", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	reset := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	s.logPatrolError("ops sample", reset) // one connection reset, the database otherwise fine
	// ... seconds later the database goes away: the patrol's first error.
	s.logPatrolError("patrol", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
	if !strings.Contains(logs.String(), `msg="patrol (the database`) {
		t.Errorf("the patrol's first outage error was not logged (hidden behind the ops sample's line for up to a minute):\n%s", logs.String())
	}
}
