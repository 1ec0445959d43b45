// Package pgbouncer runs a throwaway pgbouncer in transaction pooling mode in front of a test
// database, so tests can prove the locking core works the way operators deploy it: every
// transaction may land on another server connection, so only transaction-scoped locks and
// settings (pg_advisory_xact_lock, SET LOCAL) are allowed to matter.
package pgbouncer

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Bin finds pgbouncer: $PGBOUNCER_BIN, PATH, /usr/sbin/pgbouncer.
func Bin() (string, error) {
	if b := os.Getenv("PGBOUNCER_BIN"); b != "" {
		if _, err := os.Stat(b); err == nil {
			return b, nil
		}
	}
	if b, err := exec.LookPath("pgbouncer"); err == nil {
		return b, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", fmt.Errorf("pgbouncer not found: run `make test` (it installs it) or `apt-get install -y pgbouncer`")
}

// Start runs pgbouncer (pool_mode=transaction, poolSize server connections) in front of the
// database at upstream and returns a URL through it with default_query_exec_mode=exec (no named
// prepared statements, as pgbouncer 1.18 in transaction mode requires). Stopped at cleanup.
func Start(t testing.TB, upstream string, poolSize int) string {
	t.Helper()
	bin, err := Bin()
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	pw, _ := u.User.Password()
	db := strings.TrimPrefix(u.Path, "/")
	dir, err := os.MkdirTemp("", "pgbouncer-*")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	port := freePort(t)
	ini := fmt.Sprintf(`[databases]
%s = host=%s port=%s dbname=%s user=%s password=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = %d
max_client_conn = 500
server_reset_query =
ignore_startup_parameters = extra_float_digits,search_path
logfile = %s
pidfile = %s
`, db, u.Hostname(), u.Port(), db, u.User.Username(), pw, port, poolSize,
		filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
	cfg := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(cfg, []byte(ini), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, cfg)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if os.Geteuid() == 0 { // pgbouncer refuses to run as root
		pu, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("pgbouncer must not run as root and there is no postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(pu.Uid)
		gid, _ := strconv.Atoi(pu.Gid)
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := chownAll(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start pgbouncer: %v", err)
	}
	go func() { // drain
		s := bufio.NewScanner(stderr)
		for s.Scan() {
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		_, _ = cmd.Process.Wait()
	})
	through := fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/%s?sslmode=disable&default_query_exec_mode=exec", u.User.Username(), pw, port, db)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, through)
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return through
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			t.Fatalf("pgbouncer did not accept connections: %v\n%s", err, log)
		}
		time.Sleep(50 * time.Millisecond) // polling an external process's start-up

	}
}

func chownAll(dir string, uid, gid int) error {
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chown(p, uid, gid)
	})
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
