package pgrunner

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

const helperEnv = "PGRUNNER_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "orphan" {
		orphanHelper()
		return
	}
	goleak.VerifyTestMain(m)
}

func start(t *testing.T, opts Options) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	return c
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func setting(t *testing.T, conn *pgx.Conn, name string) string {
	t.Helper()
	var v string
	if err := conn.QueryRow(context.Background(), "SELECT current_setting($1)", name).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// sharedDir is a directory the postgres OS user can reach when the tests run as root
// (t.TempDir's parent is mode 0700).
func sharedDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "pgrunner-test-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

func TestThrowawayStartConnectStop(t *testing.T) {
	t.Parallel()
	c := start(t, Throwaway())
	conn := connect(t, c.URL("postgres"))
	for name, want := range map[string]string{"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off", "max_connections": "300", "listen_addresses": "127.0.0.1"} {
		if got := setting(t, conn, name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if os.Geteuid() == 0 {
		var user string
		_ = conn.QueryRow(context.Background(), "SELECT current_user").Scan(&user)
		st, err := os.Stat(c.DataDir())
		if err != nil {
			t.Fatal(err)
		}
		if uid := st.Sys().(*syscall.Stat_t).Uid; uid == 0 {
			t.Errorf("data dir owned by root; the server must run as the postgres OS user")
		}
	}
	url, _ := c.EnsureDatabase(context.Background(), "app")
	if _, err := c.EnsureDatabase(context.Background(), "app"); err != nil {
		t.Fatalf("EnsureDatabase twice: %v", err)
	}
	connect(t, url)
	_ = conn.Close(context.Background())

	dataDir := c.DataDir()
	if err := c.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	select {
	case <-c.Done():
	default:
		t.Fatal("Stop returned before the server exited")
	}
	if err := c.Stop(); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("throwaway data dir still exists after Stop: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(ctx, c.URL("postgres")); err == nil {
		conn.Close(ctx)
		t.Fatal("server still accepts connections after Stop")
	}
}

func TestPersistentClusterKeepsDataAcrossRestarts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := filepath.Join(sharedDir(t), ".pitlane", "pg")

	c := start(t, Dev(dir))
	conn := connect(t, c.URL("postgres"))
	if _, err := conn.Exec(ctx, "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('survives')"); err != nil {
		t.Fatal(err)
	}
	if got := setting(t, conn, "fsync"); got != "on" {
		t.Errorf("dev cluster fsync = %q, want on", got)
	}
	conn.Close(ctx)
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err != nil {
		t.Fatalf("persistent data dir gone after Stop: %v", err)
	}
	if _, err := os.Stat(dir + ".log"); err != nil {
		t.Errorf("no server log next to the data dir: %v", err)
	}

	readBack := func(c *Cluster) {
		t.Helper()
		conn := connect(t, c.URL("postgres"))
		var v string
		if err := conn.QueryRow(ctx, "SELECT v FROM kept").Scan(&v); err != nil || v != "survives" {
			t.Fatalf("after restart: %q, %v", v, err)
		}
		conn.Close(ctx)
	}

	// Restart: same data.
	c = start(t, Dev(dir))
	readBack(c)

	// A postmaster killed outright leaves postmaster.pid (and, briefly, shared memory held by
	// its children) behind; the next start must not be blocked by it.
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-c.Done()
	if _, err := os.Stat(filepath.Join(dir, "postmaster.pid")); err != nil {
		t.Fatalf("expected a stale postmaster.pid after SIGKILL: %v", err)
	}
	_ = c.Stop()
	c = start(t, Dev(dir))
	readBack(c)
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}

	// A stale postmaster.pid whose pid now belongs to an unrelated live process (pid reuse
	// after a reboot) must not block either; PostgreSQL alone would refuse to start here.
	pidFile := fmt.Sprintf("%d\n%s\n", os.Getpid(), dir)
	if err := os.WriteFile(filepath.Join(dir, "postmaster.pid"), []byte(pidFile), 0o600); err != nil {
		t.Fatal(err)
	}
	c = start(t, Dev(dir))
	readBack(c)

	// But a live server on the same data directory is reported, not trampled.
	if _, err := Start(ctx, Dev(dir)); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Fatalf("second Start on a running data dir: %v, want an 'already running' error", err)
	}
}

func TestMissingBinariesNameThePackage(t *testing.T) {
	t.Parallel()
	fakeDir := t.TempDir() // an initdb without its postgres is not an installation
	if err := os.WriteFile(filepath.Join(fakeDir, "initdb"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]Search{
		"empty":         {},
		"initdb only":   {PATH: fakeDir},
		"glob no match": {Globs: []string{filepath.Join(t.TempDir(), "*", "bin")}},
	} {
		_, err := FindBinaries(s)
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("%s: err = %v, want ErrNotFound", name, err)
			continue
		}
		if !strings.Contains(err.Error(), "apt-get install -y postgresql") || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: want one line naming the package, got %q", name, err)
		}
	}
	_, err := Start(context.Background(), Options{Search: &Search{}})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("Start with no binaries: %v", err)
	}
}

func TestFindBinariesOnPathAndInDebianDirs(t *testing.T) {
	t.Parallel()
	b, err := FindBinaries(DefaultSearch())
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(b.Initdb) != filepath.Dir(b.Postgres) {
		t.Errorf("initdb %s and postgres %s from different installations", b.Initdb, b.Postgres)
	}
	// Not on PATH: found through the glob alone.
	b2, err := FindBinaries(Search{Globs: []string{filepath.Join(b.Dir, "..", "..", "*", "bin")}})
	if err != nil {
		t.Fatalf("glob only: %v", err)
	}
	if _, err := b2.Version(); err != nil {
		t.Fatal(err)
	}
}

// TestNoOrphanWhenParentKilled kills the process that started a cluster with SIGKILL (no
// cleanup code runs) and requires the postmaster to go away anyway.
func TestNoOrphanWhenParentKilled(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=orphan")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper: %v", err)
	}
	var pid int
	var root string
	if _, err := fmt.Sscanf(line, "%d %s", &pid, &root); err != nil {
		t.Fatalf("helper said %q: %v", line, err)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open(%d): %v", pid, err)
	}
	defer unix.Close(pidfd)

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	// A pidfd becomes readable when its process exits: wait for exactly that, bounded.
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 60_000)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatalf("postmaster %d still running 60s after its parent was killed: orphaned", pid)
		}
		break
	}

	// The abandoned temp dir is collected by the next runner.
	removeAbandoned()
	if _, err := os.Stat(root); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("abandoned throwaway dir %s not removed: %v", root, err)
	}
}

// orphanHelper runs in a child process: start a cluster, report it, wait to be killed.
func orphanHelper() {
	c, err := Start(context.Background(), Throwaway())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(strconv.Itoa(c.PID()), filepath.Dir(c.DataDir()))
	select {}
}
