// Command testpg runs a command against a throwaway PostgreSQL cluster:
//
//	testpg -- go test -race ./...
//
// starts a cluster (internal/pgrunner), runs the command with TEST_DATABASE_URL pointing at
// it, stops the cluster whatever happens to the command, and exits with the command's status
// (128+n when a signal n ended it). SIGINT and SIGTERM are forwarded to the command, and the
// cluster is stopped after it exits. Without a command it prints the export line and keeps the
// cluster until Ctrl-C, for running single tests from another terminal.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"pitlane/internal/pgrunner"
)

// envURL is the variable the test bench (internal/testdb) reads.
const envURL = "TEST_DATABASE_URL"

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("testpg", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: testpg [-- command args...]")
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	rest := fs.Args()

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-sigs: // interrupted while starting
			cancel()
		case <-ctx.Done():
		}
	}()
	cluster, err := pgrunner.Start(ctx, pgrunner.Throwaway())
	cancel()
	if err != nil {
		fmt.Fprintln(stderr, "testpg:", err)
		return 2
	}
	url := cluster.URL("postgres")
	fmt.Fprintf(stderr, "testpg: PostgreSQL on 127.0.0.1:%d (log: %s)\n", cluster.Port(), cluster.LogPath())

	code := 0
	if len(rest) == 0 {
		fmt.Fprintf(stdout, "export %s='%s'\n", envURL, url)
		fmt.Fprintln(stderr, "testpg: Ctrl-C stops the cluster")
		select {
		case <-sigs:
		case <-cluster.Done():
			fmt.Fprintln(stderr, "testpg: postgres exited")
			code = 1
		}
	} else {
		code = runCommand(rest, url, sigs, stderr)
	}
	if err := cluster.Stop(); err != nil {
		fmt.Fprintln(stderr, "testpg:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func runCommand(argv []string, url string, sigs <-chan os.Signal, stderr io.Writer) int {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), envURL+"="+url)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "testpg:", err)
		return 127
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	for {
		select {
		case s := <-sigs:
			_ = cmd.Process.Signal(s)
		case err := <-waited:
			var exitErr *exec.ExitError
			if err != nil && !errors.As(err, &exitErr) {
				fmt.Fprintln(stderr, "testpg:", err)
				return 1
			}
			ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
			if ws.Signaled() {
				return 128 + int(ws.Signal())
			}
			return cmd.ProcessState.ExitCode()
		}
	}
}
