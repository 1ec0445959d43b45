package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The CPU a figure cost, per process kind, from /proc: where a figure over HTTP spends the
// machine's cores (the serve process, this program — the load generator and the gateway
// simulator —, PostgreSQL's processes). The figure is a rate on a CPU-bound machine, so its CPU
// per operation is what the rate is made of.

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times (100 on every Linux this runs on).
const clockTicks = 100

// cpuSample is each process's CPU seconds so far, by key: "serve", "bench", and "postgres/PID"
// for each PostgreSQL process (kind, slash, pid).
type cpuSample map[string]float64

// procCPU reads utime+stime of one process in seconds, and its command name.
func procCPU(pid string) (string, float64, bool) {
	comm, own, _, _, ok := procStat(pid)
	return comm, own, ok
}

// procStat is procCPU with the CPU of the process's children it has reaped (cutime+cstime: for
// the postmaster, every backend that exited) and its parent pid.
func procStat(pid string) (comm string, own, reaped float64, ppid string, ok bool) {
	raw, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return "", 0, 0, "", false
	}
	s := string(raw)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return "", 0, 0, "", false
	}
	comm = s[open+1 : closing]
	f := strings.Fields(s[closing+1:])
	if len(f) < 15 { // state is field 3, ppid 4; utime, stime, cutime and cstime are fields 14 to 17
		return "", 0, 0, "", false
	}
	var t [4]float64
	for i := range t {
		v, err := strconv.ParseFloat(f[11+i], 64)
		if err != nil {
			return "", 0, 0, "", false
		}
		t[i] = v / clockTicks
	}
	return comm, t[0] + t[1], t[2] + t[3], f[1], true
}

// reapedKey prefixes the CPU of PostgreSQL processes that exited and were reaped (the
// postmaster's cutime+cstime), one key per cluster ("postgres-reaped/POSTMASTER"): a pgbench
// round's backends are gone by the sample after it.
const reapedKey = "postgres-reaped"

// sampleCPU reads the CPU so far of the serve process (servePID), of this program, and of every
// PostgreSQL process on the machine, each keyed by its cluster: "postgres/POSTMASTER/PID" (the
// postmaster is its own cluster's). Only clusters alive at both samples are counted (cpuPerOp):
// another cluster started or stopped in between (a test's private PostgreSQL beside `make test`'s
// TestBenchSmall) took its whole CPU with it, and made PostgreSQL's share negative (a fresh-clone
// CI run: -26 ms per Create).
func sampleCPU(servePID int) cpuSample {
	out := cpuSample{}
	if _, t, ok := procCPU(strconv.Itoa(servePID)); ok {
		out["serve"] = t
	}
	if _, t, ok := procCPU("self"); ok {
		out["bench"] = t
	}
	type pg struct {
		own, reaped float64
		ppid        string
	}
	procs := map[string]pg{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		if comm, own, reaped, ppid, ok := procStat(e.Name()); ok && comm == "postgres" {
			procs[e.Name()] = pg{own, reaped, ppid}
		}
	}
	for pid, p := range procs {
		cluster := pid // a postmaster: its parent is no PostgreSQL process
		if _, child := procs[p.ppid]; child {
			cluster = p.ppid
		}
		out["postgres/"+cluster+"/"+pid] = p.own
		out[reapedKey+"/"+cluster] += p.reaped
	}
	return out
}

// perOp is the CPU milliseconds each kind spent per operation between two samples, as text.
// Each process alive at the second sample counts what it spent since the first (from zero if it
// started in between). A PostgreSQL process that exited in between counts what it spent after
// the first sample: its whole CPU reached the postmaster's reaped total when it exited, less what
// it had at the first sample. (Subtracting the exited processes' CPU without the reaped total made
// PostgreSQL's share negative with six rounds a side; ignoring them lost a pgbench round's
// backends, which exit with pgbench.)
func perOp(before, after cpuSample, ops int) string {
	if ops <= 0 {
		return ""
	}
	byKind, total := cpuPerOp(before, after, ops)
	var parts []string
	for _, k := range cpuKinds {
		parts = append(parts, fmt.Sprintf("%s %.2f", k, byKind[k]))
	}
	return fmt.Sprintf("%s, total %.2f ms", strings.Join(parts, ", "), total)
}

// cpuKinds are the process kinds of a cpuSample, in the order they are printed.
var cpuKinds = []string{"serve", "bench", "postgres"}

// cpuPerOp is perOp in numbers: the CPU milliseconds per operation of each kind, and their sum.
// PostgreSQL counts the clusters alive at both samples only (sampleCPU).
func cpuPerOp(before, after cpuSample, ops int) (map[string]float64, float64) {
	byKind := map[string]float64{}
	if ops <= 0 {
		return byKind, 0
	}
	both := func(key string) bool { // the key's cluster is in both samples
		cluster := ""
		if rest, ok := strings.CutPrefix(key, reapedKey+"/"); ok {
			cluster = rest
		} else if rest, ok := strings.CutPrefix(key, "postgres/"); ok {
			cluster, _, _ = strings.Cut(rest, "/")
		} else {
			return true
		}
		_, b := before[reapedKey+"/"+cluster]
		_, a := after[reapedKey+"/"+cluster]
		return a && b
	}
	for k, v := range after {
		if !both(k) {
			continue
		}
		kind, _, _ := strings.Cut(k, "/")
		if kind == reapedKey {
			kind = "postgres"
		}
		byKind[kind] += (v - before[k]) * 1000 / float64(ops)
	}
	for k, v := range before {
		if _, alive := after[k]; !alive && strings.HasPrefix(k, "postgres/") && both(k) {
			byKind["postgres"] -= v * 1000 / float64(ops) // reaped in between: counted whole above
		}
	}
	total := 0.0
	for _, k := range cpuKinds {
		total += byKind[k]
	}
	return byKind, total
}
