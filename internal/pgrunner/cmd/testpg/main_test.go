package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The test binary doubles as the testpg binary and as a command for it to run.
const roleEnv = "TESTPG_TEST_ROLE"

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "testpg":
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	case "query": // a "test suite" that needs the database
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, os.Getenv(envURL))
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(4)
		}
		var one int
		if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
			os.Exit(5)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

var portRE = regexp.MustCompile(`127\.0\.0\.1:(\d+)`)

func assertStopped(t *testing.T, stderr string) {
	t.Helper()
	m := portRE.FindStringSubmatch(stderr)
	if m == nil {
		t.Fatalf("no address in testpg's output: %q", stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:"+m[1]+"/postgres?sslmode=disable"); err == nil {
		conn.Close(ctx)
		t.Fatal("cluster still running after testpg returned")
	}
}

func TestRunsCommandWithURLAndReturnsItsStatus(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run([]string{"--", "sh", "-c", `test -n "$TEST_DATABASE_URL" && env ` + roleEnv + `=query "$0"`, os.Args[0]}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d, want 0; stderr: %s", code, stderr.String())
	}
	assertStopped(t, stderr.String())
}

func TestFailingCommandStopsClusterAndPropagatesStatus(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run([]string{"--", "sh", "-c", "exit 3"}, &stdout, &stderr)
	if code != 3 {
		t.Fatalf("exit %d, want 3", code)
	}
	assertStopped(t, stderr.String())
}

func TestSIGTERMStopsCommandAndCluster(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "--", "sh", "-c", "echo started; exec sleep 600")
	cmd.Env = append(os.Environ(), roleEnv+"=testpg")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "started" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("command did not start: %q, %s", line, stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if got := cmd.ProcessState.ExitCode(); got != 128+int(syscall.SIGTERM) {
		t.Errorf("exit %d, want %d (the command's death by SIGTERM)", got, 128+int(syscall.SIGTERM))
	}
	assertStopped(t, stderr.String())
}
