package main

import (
	"bufio"
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestGatewaysimCommand: `pitlane gatewaysim --addr 127.0.0.1:0` serves the simulator (its
// control API answers) and stops cleanly on SIGTERM.
func TestGatewaysimCommand(t *testing.T) {
	t.Parallel()
	cmd := pitlane(nil, "gatewaysim", "--addr", "127.0.0.1:0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("no first line: %v; stderr: %s", err, stderr.String())
	}
	base, ok := strings.CutPrefix(strings.TrimSpace(line), "gatewaysim listening on ")
	if !ok {
		t.Fatalf("first line %q", line)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(base + "/_sim/state")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	client.CloseIdleConnections()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/_sim/state = %d", resp.StatusCode)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("gatewaysim after SIGTERM: %v; stderr: %s", err, stderr.String())
	}
}

func TestGatewaysimBadFlagExitsTwo(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	env := &Env{Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" },
		Logger: slog.New(slog.DiscardHandler)}
	if code := Main([]string{"gatewaysim", "--no-such-flag"}, env); code != 2 {
		t.Fatalf("exit %d, want 2; stderr %q", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "pitlane gatewaysim: flag provided but not defined: -no-such-flag\n") {
		t.Fatalf("stderr %q does not end with the one-line reason", stderr.String())
	}
}
