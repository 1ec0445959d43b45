// Package pgrunner runs a private PostgreSQL server from the machine's own PostgreSQL binaries:
// the persistent cluster of `pitlane dev` (.pitlane/pg) and the throwaway cluster of `make test`.
//
// Why not a library: embedded-postgres style libraries download server binaries at run time
// (impossible here) and none runs the server as the `postgres` OS user when we are root, which
// PostgreSQL insists on. What remains is small: initdb once, then run `postgres` as our child.
//
// "No orphaned postgres, ever" is the design constraint, and it is why pg_ctl is not used:
// `pg_ctl start` double-forks the postmaster away from us, so a SIGKILLed parent leaves it
// running. Instead the postmaster is our direct child, started with a parent-death signal
// (Linux PR_SET_PDEATHSIG = SIGINT, i.e. PostgreSQL's fast shutdown) from an OS thread that
// stays locked for the child's whole life (the kernel sends the signal when the *thread* that
// forked exits, and Go may otherwise retire threads). It runs in its own process group, so a
// Ctrl-C in the terminal reaches us, not it, and we shut down in order: HTTP first, database
// last. Stop does what `pg_ctl stop -m fast` does: SIGINT, then wait.
package pgrunner

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Superuser is the bootstrap role initdb creates; with trust auth on 127.0.0.1 it needs no
// password.
const Superuser = "postgres"

// ThrowawaySettings trade durability for speed: a test cluster's data is worth nothing after
// the run. max_connections is high because `go test ./...` runs several packages at once,
// each with pools on several cloned databases.
var ThrowawaySettings = map[string]string{
	"fsync":              "off",
	"synchronous_commit": "off",
	"full_page_writes":   "off",
	"max_connections":    "300",
}

// Options configure a cluster.
type Options struct {
	// DataDir is the data directory of a persistent cluster; it is created and initialised on
	// first use and kept afterwards. Empty: a throwaway cluster in a fresh temporary directory,
	// deleted by Stop.
	DataDir string
	// LogPath receives the server's log (appended). Default: DataDir + ".log", or a file in
	// the throwaway directory.
	LogPath string
	// Settings are passed as `-c name=value`.
	Settings map[string]string
	// Search says where the binaries are; nil: DefaultSearch().
	Search *Search
	// StartTimeout bounds the wait for the server to accept connections (default 60s).
	StartTimeout time.Duration
}

// Dev is the persistent cluster of `pitlane dev`.
func Dev(dataDir string) Options { return Options{DataDir: dataDir} }

// Throwaway is the test cluster: temporary, unsynchronised.
func Throwaway() Options { return Options{Settings: ThrowawaySettings} }

// Cluster is a running server.
type Cluster struct {
	bin       Binaries
	dataDir   string
	tempRoot  string // removed on Stop (throwaway dir, or the socket dir of a persistent cluster)
	ephemeral bool
	logPath   string
	port      int

	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error

	mu       sync.Mutex
	stopping bool
	stopOnce sync.Once
	stopErr  error
}

// Start initialises (when needed) and starts a cluster and returns once it accepts
// connections. The caller must call Stop; if the caller dies first, the kernel stops the server.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	search := DefaultSearch()
	if opts.Search != nil {
		search = *opts.Search
	}
	bin, err := FindBinaries(search)
	if err != nil {
		return nil, err
	}
	cred, err := runAsCredential()
	if err != nil {
		return nil, err
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 60 * time.Second
	}
	removeAbandoned()

	c := &Cluster{bin: bin, logPath: opts.LogPath}
	if opts.DataDir == "" {
		root, err := newTempRoot(cred)
		if err != nil {
			return nil, err
		}
		c.tempRoot, c.ephemeral = root, true
		c.dataDir = filepath.Join(root, "data")
		if c.logPath == "" {
			c.logPath = filepath.Join(root, "postgres.log")
		}
	} else {
		abs, err := filepath.Abs(opts.DataDir)
		if err != nil {
			return nil, fmt.Errorf("pgrunner: data dir: %w", err)
		}
		c.dataDir = abs
		if c.logPath == "" {
			c.logPath = abs + ".log"
		}
	}
	ok := false
	defer func() {
		if !ok {
			c.cleanup()
		}
	}()

	if err := c.prepareDataDir(cred); err != nil {
		return nil, err
	}
	if c.tempRoot == "" { // persistent: the socket still goes to a short temp path
		if c.tempRoot, err = newTempRoot(cred); err != nil {
			return nil, err
		}
	}
	if err := c.start(ctx, cred, opts); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

// prepareDataDir runs initdb when the directory holds no cluster yet, checks the version of
// one that exists, hands it to the postgres OS user when we are root and clears a stale
// postmaster.pid.
func (c *Cluster) prepareDataDir(cred *syscall.Credential) error {
	if cred != nil {
		if err := reachable(filepath.Dir(c.dataDir), cred.Uid); err != nil {
			return err
		}
	}
	if _, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		return c.initdb(cred)
	} else if err != nil {
		return fmt.Errorf("pgrunner: %w", err)
	}
	have, err := os.ReadFile(filepath.Join(c.dataDir, "PG_VERSION"))
	if err != nil {
		return fmt.Errorf("pgrunner: %w", err)
	}
	want, err := c.bin.Version()
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(have)) != want {
		return fmt.Errorf("pgrunner: %s holds a PostgreSQL %s cluster but the binaries in %s are PostgreSQL %s; remove the directory to start over (its data is lost)",
			c.dataDir, strings.TrimSpace(string(have)), c.bin.Dir, want)
	}
	if cred != nil {
		if err := chownTree(c.dataDir, cred); err != nil {
			return err
		}
	}
	return clearStalePid(c.dataDir)
}

// initdb creates the cluster in a sibling directory and renames it into place, so an
// interrupted initdb never leaves a half-made DataDir that the next start would trip over.
func (c *Cluster) initdb(cred *syscall.Credential) error {
	tmp := c.dataDir + ".initdb"
	if c.ephemeral {
		tmp = c.dataDir
	}
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("pgrunner: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(tmp), 0o755); err != nil {
		return fmt.Errorf("pgrunner: %w", err)
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return fmt.Errorf("pgrunner: %w", err)
	}
	if cred != nil {
		if err := os.Chown(tmp, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("pgrunner: %w", err)
		}
	}
	args := []string{"-D", tmp, "-U", Superuser, "-A", "trust", "-E", "UTF8", "--locale=C"}
	if c.ephemeral {
		args = append(args, "--no-sync")
	}
	cmd := exec.Command(c.bin.Initdb, args...)
	cmd.Dir = "/"
	cmd.Env = serverEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgrunner: initdb %s: %w\n%s", tmp, err, tail(string(out), 15))
	}
	if tmp != c.dataDir {
		if err := os.Rename(tmp, c.dataDir); err != nil {
			return fmt.Errorf("pgrunner: %w", err)
		}
	}
	return nil
}

// start launches the postmaster on a free port and waits until it accepts connections.
// Picking a free port and binding it are two steps, so another process can take the port in
// between: the postmaster then exits with "could not bind" and we try again on another one.
func (c *Cluster) start(ctx context.Context, cred *syscall.Credential, opts Options) error {
	deadline := time.Now().Add(opts.StartTimeout)
	var lastErr error
	for attempt := 0; attempt < 5 && time.Now().Before(deadline); attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		logOffset := fileSize(c.logPath)
		if err := c.spawn(cred, port, opts.Settings); err != nil {
			return err
		}
		err = c.waitReady(ctx, deadline)
		if err == nil {
			return nil
		}
		_ = c.kill()
		log := readFrom(c.logPath, logOffset)
		lastErr = fmt.Errorf("pgrunner: postgres did not start: %w\n%s (log: %s)", err, tail(log, 15), c.logPath)
		if ctx.Err() != nil {
			return lastErr
		}
		// A port taken in between, or the shared memory of a SIGKILLed predecessor whose
		// children have not noticed yet: both clear up by themselves, so try again.
		if !strings.Contains(log, "could not bind") && !strings.Contains(log, "still in use") && !strings.Contains(log, "already exists") {
			return lastErr
		}
		if err := clearStalePid(c.dataDir); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return lastErr
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		}
	}
	return lastErr
}

func (c *Cluster) spawn(cred *syscall.Credential, port int, settings map[string]string) error {
	logf, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgrunner: log: %w", err)
	}
	defer logf.Close() // the child holds its own copy of the descriptor

	args := []string{"-D", c.dataDir, "-p", strconv.Itoa(port), "-k", c.tempRoot,
		"-c", "listen_addresses=127.0.0.1"}
	for k, v := range settings {
		args = append(args, "-c", k+"="+v)
	}
	cmd := exec.Command(c.bin.Postgres, args...)
	cmd.Dir = "/"
	cmd.Env = serverEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childAttr(cred)

	c.port, c.cmd, c.done, c.waitErr = port, cmd, make(chan struct{}), nil
	started := make(chan error, 1)
	done := c.done
	go func() {
		// The parent-death signal is tied to the forking thread: keep it alive (locked to this
		// goroutine, which waits) for as long as the child lives.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		err := cmd.Wait()
		c.mu.Lock()
		c.waitErr = err
		c.mu.Unlock()
		close(done)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("pgrunner: start %s: %w", c.bin.Postgres, err)
	}
	return nil
}

// waitReady polls with real connection attempts (what every later user will do) until one
// succeeds, the server exits, or the deadline passes.
func (c *Cluster) waitReady(ctx context.Context, deadline time.Time) error {
	cfg, err := pgx.ParseConfig(c.URL("postgres"))
	if err != nil {
		return err
	}
	cfg.ConnectTimeout = 2 * time.Second
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for {
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-c.done:
			return fmt.Errorf("postgres exited: %v", c.exitErr())
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not accepting connections on port %d: %w", c.port, err)
		}
	}
}

// URL returns a connection URL for database db.
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", Superuser, c.port, db)
}

// Port is the TCP port on 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// DataDir is the data directory.
func (c *Cluster) DataDir() string { return c.dataDir }

// LogPath is where the server logs.
func (c *Cluster) LogPath() string { return c.logPath }

// PID is the postmaster's process id.
func (c *Cluster) PID() int { return c.cmd.Process.Pid }

// Done is closed when the server has exited, for whatever reason.
func (c *Cluster) Done() <-chan struct{} { return c.done }

// EnsureDatabase creates database name unless it exists and returns its URL.
func (c *Cluster) EnsureDatabase(ctx context.Context, name string) (string, error) {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return "", fmt.Errorf("pgrunner: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", fmt.Errorf("pgrunner: look up database %s: %w", name, err)
	}
	if !exists {
		_, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		var pgErr *pgconn.PgError
		if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42P04") { // duplicate_database: a racing creator won
			return "", fmt.Errorf("pgrunner: create database %s: %w", name, err)
		}
	}
	return c.URL(name), nil
}

// Stop shuts the server down like `pg_ctl stop -m fast` (SIGINT: disconnect clients, checkpoint,
// exit), escalating to immediate shutdown and then SIGKILL if it hangs, and removes the
// throwaway directory. Safe to call more than once.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		c.mu.Lock()
		c.stopping = true
		c.mu.Unlock()
		select {
		case <-c.done:
			if err := c.exitErr(); err != nil {
				c.stopErr = fmt.Errorf("pgrunner: postgres had already exited: %w (log: %s)", err, c.logPath)
			}
		default:
			c.stopErr = c.shutdown()
		}
		c.cleanup()
	})
	return c.stopErr
}

func (c *Cluster) shutdown() error {
	for _, step := range []struct {
		sig  syscall.Signal
		wait time.Duration
	}{{syscall.SIGINT, 60 * time.Second}, {syscall.SIGQUIT, 10 * time.Second}, {syscall.SIGKILL, time.Minute}} {
		_ = c.cmd.Process.Signal(step.sig)
		select {
		case <-c.done:
			if step.sig != syscall.SIGINT {
				return fmt.Errorf("pgrunner: postgres ignored fast shutdown; sent %v", step.sig)
			}
			if err := c.exitErr(); err != nil {
				return fmt.Errorf("pgrunner: postgres exited: %w (log: %s)", err, c.logPath)
			}
			return nil
		case <-time.After(step.wait):
		}
	}
	return fmt.Errorf("pgrunner: postgres (pid %d) did not exit", c.cmd.Process.Pid)
}

// kill ends a postmaster that failed to become ready.
func (c *Cluster) kill() error {
	if c.cmd == nil || c.cmd.Process == nil {
		return nil
	}
	select {
	case <-c.done:
		return nil
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
	return nil
}

func (c *Cluster) exitErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waitErr
}

func (c *Cluster) cleanup() {
	if c.tempRoot != "" {
		_ = os.RemoveAll(c.tempRoot)
	}
}

// runAsCredential returns the postgres OS user's credential when we are root (the server
// refuses to run as root), nil otherwise (run as the caller).
func runAsCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(Superuser)
	if err != nil {
		return nil, fmt.Errorf("pgrunner: running as root needs the %q OS user to run the server as (PostgreSQL refuses root); it comes with: %s", Superuser, InstallHint)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("pgrunner: user %s: bad uid/gid %s/%s", Superuser, u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// reachable checks that the postgres OS user can traverse every parent of dir, so that the
// failure is this sentence instead of initdb's "permission denied".
func reachable(dir string, uid uint32) error {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err == nil {
			st, _ := fi.Sys().(*syscall.Stat_t)
			if fi.Mode().Perm()&0o001 == 0 && (st == nil || st.Uid != uid) {
				return fmt.Errorf("pgrunner: the %s OS user cannot reach %s (no search permission on %s); chmod o+x it or pick another directory", Superuser, dir, d)
			}
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

func chownTree(dir string, cred *syscall.Credential) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("pgrunner: %w", err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid == cred.Uid {
		return nil
	}
	return filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(cred.Uid), int(cred.Gid))
	})
}

// clearStalePid removes a postmaster.pid left by a server that no longer runs (killed with
// SIGKILL, machine crash). PostgreSQL does this itself when the recorded pid is gone, but after
// a restart the pid may have been reused by an unrelated process and the server would refuse
// to start; only a live postgres serving this very data directory counts.
func clearStalePid(dataDir string) error {
	pidFile := filepath.Join(dataDir, "postmaster.pid")
	b, err := os.ReadFile(pidFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("pgrunner: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(first))
	if pid > 0 && alive(pid) {
		running := true // without /proc we cannot tell: assume the worst
		if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil {
			running = strings.Contains(string(cmdline), dataDir)
		}
		if running {
			return fmt.Errorf("pgrunner: a PostgreSQL server (pid %d) is already running on %s (another `pitlane dev` in this directory?); stop it first", pid, dataDir)
		}
	}
	if err := os.Remove(pidFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("pgrunner: remove stale %s: %w", pidFile, err)
	}
	return nil
}

func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

const tempPrefix = "pitlane-pg-"

// newTempRoot makes a short-pathed temp dir (Unix socket paths are limited to ~100 bytes)
// owned by the server's user and records our pid in it, so that a later run can remove it if
// we die without cleaning up.
func newTempRoot(cred *syscall.Credential) (string, error) {
	root, err := os.MkdirTemp("", tempPrefix)
	if err != nil {
		return "", fmt.Errorf("pgrunner: %w", err)
	}
	if err := os.WriteFile(filepath.Join(root, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return "", fmt.Errorf("pgrunner: %w", err)
	}
	if cred != nil {
		if err := os.Chown(root, int(cred.Uid), int(cred.Gid)); err != nil {
			return "", fmt.Errorf("pgrunner: %w", err)
		}
	}
	return root, nil
}

// removeAbandoned deletes temp dirs whose owner process is gone (it was SIGKILLed; its server
// stopped through the parent-death signal, but nobody removed the files).
func removeAbandoned() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), tempPrefix+"*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "owner.pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || alive(pid) {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "data", "postmaster.pid")); err == nil {
			continue // its server is still shutting down
		}
		_ = os.RemoveAll(d)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgrunner: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// serverEnv is our environment without PG* variables, which would otherwise steer initdb or
// the server (PGDATA, PGPORT, …) away from what we pass explicitly.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	return env
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func readFrom(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(io.LimitReader(f, 1<<20))
	return string(b)
}

func tail(s string, n int) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
