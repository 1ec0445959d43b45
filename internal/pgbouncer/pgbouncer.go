// Package pgbouncer runs a throwaway pgbouncer in transaction pooling mode in front of a test
// database, so tests can prove the locking core works the way operators deploy it: every
// transaction may land on another server connection, so only transaction-scoped locks and
// settings (pg_advisory_xact_lock, SET LOCAL) are allowed to matter.
package pgbouncer

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"maps"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
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
	through, err := StartWith(t, upstream, map[string]string{"default_pool_size": strconv.Itoa(poolSize)})
	if err != nil {
		t.Fatal(err)
	}
	return through
}

// throwawayCertificate writes a self-signed certificate for 127.0.0.1 and its key into dir (a
// client with sslmode=require encrypts without verifying it) and returns the two files.
func throwawayCertificate(dir string) (keyFile, certFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	keyFile, certFile = filepath.Join(dir, "tls.key"), filepath.Join(dir, "tls.crt")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return "", "", err
	}
	return keyFile, certFile, nil
}

// defaults are the [pgbouncer] settings of Start: transaction pooling, as pitlane is deployed.
var defaults = map[string]string{
	"pool_mode":                 "transaction",
	"default_pool_size":         "3",
	"max_client_conn":           "500",
	"server_reset_query":        "",
	"ignore_startup_parameters": "extra_float_digits,search_path",
}

// Site are the [pgbouncer] settings StartWith always sets itself, whatever settings says:
// where it listens, how clients authenticate (any user, the test database's own credentials
// upstream), the certificate it presents to clients (a throwaway one, when settings ask for
// client TLS), TLS toward the test database (which has none) and where it writes its log and
// pid. Everything else comes from settings.
var Site = []string{"listen_addr", "listen_port", "unix_socket_dir", "auth_type", "auth_file", "auth_query", "auth_user",
	"logfile", "pidfile", "admin_users", "stats_users", "client_tls_key_file", "client_tls_cert_file", "client_tls_ca_file",
	"server_tls_sslmode", "server_tls_ca_file", "server_tls_key_file", "server_tls_cert_file"}

// StartWith runs pgbouncer in front of the database at upstream with the given [pgbouncer]
// settings over Start's defaults (the Site keys excepted), and returns a URL through it with
// default_query_exec_mode=exec. A configuration pgbouncer refuses (it exits at start: an unknown
// key, a bad value) or one it does not serve with is an error carrying pgbouncer's own words.
// Stopped at cleanup.
func StartWith(t testing.TB, upstream string, settings map[string]string) (string, error) {
	t.Helper()
	bin, err := Bin()
	if err != nil {
		return "", err
	}
	u, err := url.Parse(upstream)
	if err != nil {
		return "", err
	}
	pw, _ := u.User.Password()
	db := strings.TrimPrefix(u.Path, "/")
	dir, err := os.MkdirTemp("", "pgbouncer-*")
	if err != nil {
		return "", err
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	port := freePort(t)

	merged := maps.Clone(defaults)
	maps.Copy(merged, settings)
	for _, k := range Site {
		delete(merged, k)
	}
	maps.Copy(merged, map[string]string{
		"listen_addr":        "127.0.0.1",
		"listen_port":        strconv.Itoa(port),
		"unix_socket_dir":    "",
		"auth_type":          "any",
		"logfile":            filepath.Join(dir, "pgbouncer.log"),
		"pidfile":            filepath.Join(dir, "pgbouncer.pid"),
		"server_tls_sslmode": "disable",
	})
	sslmode := "disable"
	if mode := merged["client_tls_sslmode"]; mode != "" && mode != "disable" {
		key, cert, err := throwawayCertificate(dir)
		if err != nil {
			return "", err
		}
		merged["client_tls_key_file"], merged["client_tls_cert_file"] = key, cert
		sslmode = "require"
	}
	var ini strings.Builder
	fmt.Fprintf(&ini, "[databases]\n%s = host=%s port=%s dbname=%s user=%s password=%s\n\n[pgbouncer]\n",
		db, u.Hostname(), u.Port(), db, u.User.Username(), pw)
	for _, k := range slices.Sorted(maps.Keys(merged)) {
		fmt.Fprintf(&ini, "%s = %s\n", k, merged[k])
	}
	cfg := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(cfg, []byte(ini.String()), 0o600); err != nil {
		return "", err
	}
	cmd := exec.Command(bin, cfg)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if os.Geteuid() == 0 { // pgbouncer refuses to run as root
		pu, err := user.Lookup("postgres")
		if err != nil {
			return "", fmt.Errorf("pgbouncer must not run as root and there is no postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(pu.Uid)
		gid, _ := strconv.Atoi(pu.Gid)
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := chownAll(dir, uid, gid); err != nil {
			return "", err
		}
	}
	var stderr lockedTail
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start pgbouncer: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		<-exited
	})
	through := fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/%s?sslmode=%s&default_query_exec_mode=exec", u.User.Username(), pw, port, db, sslmode)
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
			return through, nil
		}
		select {
		case <-exited:
			return "", fmt.Errorf("pgbouncer exited at start (refused its configuration?): %s", strings.TrimSpace(stderr.String()))
		default:
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			return "", fmt.Errorf("pgbouncer did not accept connections: %w\n%s", err, log)
		}
		time.Sleep(50 * time.Millisecond) // polling an external process's start-up
	}
}

// lockedTail keeps the last few KiB a process wrote, for an error message.
type lockedTail struct {
	mu  sync.Mutex
	buf []byte
}

func (l *lockedTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	if over := len(l.buf) - 4096; over > 0 {
		l.buf = l.buf[over:]
	}
	return len(p), nil
}

func (l *lockedTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.buf)
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
