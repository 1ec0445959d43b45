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
	raw, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return "", 0, false
	}
	s := string(raw)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return "", 0, false
	}
	comm := s[open+1 : closing]
	f := strings.Fields(s[closing+1:])
	if len(f) < 13 { // state is field 3; utime and stime are fields 14 and 15
		return "", 0, false
	}
	u, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return "", 0, false
	}
	return comm, (u + st) / clockTicks, true
}

// sampleCPU reads the CPU so far of the serve process (servePID), of this program, and of every
// PostgreSQL process on the machine (the private cluster's: the bench runs alone).
func sampleCPU(servePID int) cpuSample {
	out := cpuSample{}
	if _, t, ok := procCPU(strconv.Itoa(servePID)); ok {
		out["serve"] = t
	}
	if _, t, ok := procCPU("self"); ok {
		out["bench"] = t
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		if comm, t, ok := procCPU(e.Name()); ok && comm == "postgres" {
			out["postgres/"+e.Name()] = t
		}
	}
	return out
}

// perOp is the CPU milliseconds each kind spent per operation between two samples, as text. It
// counts the processes alive at the second sample: one that exited in between (a pgbench backend
// of the round before) is not the figure's, and subtracting its CPU would make PostgreSQL's share
// negative (as it did with six rounds a side); one that started in between counts from zero.
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
func cpuPerOp(before, after cpuSample, ops int) (map[string]float64, float64) {
	byKind := map[string]float64{}
	if ops <= 0 {
		return byKind, 0
	}
	for k, v := range after {
		kind, _, _ := strings.Cut(k, "/")
		byKind[kind] += (v - before[k]) * 1000 / float64(ops)
	}
	total := 0.0
	for _, k := range cpuKinds {
		total += byKind[k]
	}
	return byKind, total
}
