package main

import "testing"

// CPU per operation counts each process alive at the second sample from the first (a new one
// from zero), and a PostgreSQL backend that exited in between by what it spent after the first
// sample: its whole CPU is in the postmaster's reaped total, less what it had then. Controls:
// summing each kind within a sample first gives PostgreSQL (1.5+0.5) - (1+3) = -2 s here, the kind
// of negative share the full run at 08:31 UTC printed; counting only the processes alive at the
// end loses the exited one's 0.4 s (a pgbench round's backends, which exit with pgbench).
//
// Only clusters alive at both samples count: cluster 900 (a test's private PostgreSQL) stopped in
// between, and cluster 950 started; counted, the one took 9 s of PostgreSQL's share away (a
// fresh-clone CI run printed -26 ms per Create), the other added 2 s it did not spend for us.
func TestPerOpCountsTheProcessesAliveAtTheEnd(t *testing.T) {
	// In cluster 50, 200 exited with 3.4 s (its whole CPU now in the postmaster's reaped total),
	// 300 started.
	before := cpuSample{"bench": 10, "postgres/50/50": 0, "postgres/50/100": 1, "postgres/50/200": 3, reapedKey + "/50": 7,
		"postgres/900/900": 1, "postgres/900/901": 8, reapedKey + "/900": 20}
	after := cpuSample{"bench": 11, "postgres/50/50": 0, "postgres/50/100": 1.5, "postgres/50/300": 0.5, reapedKey + "/50": 10.4,
		"postgres/950/950": 0.5, "postgres/950/951": 1.5, reapedKey + "/950": 0}
	got := perOp(before, after, 1000)
	if want := "serve 0.00, bench 1.00, postgres 1.40, total 2.40 ms"; got != want {
		t.Fatalf("perOp = %q, want %q", got, want)
	}
}
