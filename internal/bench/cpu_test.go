package main

import "testing"

// CPU per operation counts the processes alive at the second sample: a PostgreSQL backend that
// exited in between (a pgbench backend of the round before) is not subtracted, a new one counts
// from zero, and the backends add up to PostgreSQL's share. Control: summing each kind within a
// sample first (the code before) gives PostgreSQL (1.5+0.5) - (1+3) = -2 s here, the kind of
// negative share the full run at 08:31 UTC printed (-0.04 ms per Create); with the code before,
// this test fails.
func TestPerOpCountsTheProcessesAliveAtTheEnd(t *testing.T) {
	before := cpuSample{"bench": 10, "postgres/100": 1, "postgres/200": 3}
	after := cpuSample{"bench": 11, "postgres/100": 1.5, "postgres/300": 0.5} // 200 exited, 300 started
	got := perOp(before, after, 1000)
	if want := "serve 0.00, bench 1.00, postgres 1.00, total 2.00 ms"; got != want {
		t.Fatalf("perOp = %q, want %q", got, want)
	}
}
