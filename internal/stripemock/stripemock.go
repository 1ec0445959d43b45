// Package stripemock runs stripe-mock (github.com/stripe/stripe-mock) for tests: a stateless
// server that validates every request against Stripe's OpenAPI spec (an unknown or malformed
// parameter is a 400) and answers with fixture objects. It proves that what pitlane sends is a
// request Stripe would accept; it does not simulate Stripe's behaviour (see Start).
//
// Like the database bench, a test that needs stripe-mock and cannot find it FAILS with
// instructions: it never skips, so a green run always means these tests ran.
package stripemock

import (
	"bufio"
	"bytes"
	"fmt"
	"go/build"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Version is the stripe-mock release the bench installs (Makefile) and the message names.
const Version = "v0.203.0"

// EnvBin names the variable that points at the binary; `make test` exports it.
const EnvBin = "STRIPE_MOCK_BIN"

// TestKey is a secret key stripe-mock accepts (it checks only the shape of the key).
const TestKey = "sk_test_pitlane"

const (
	startTimeout = 20 * time.Second // spec loading takes ~1 s; a slow shared machine gets slack
	pollEvery    = 25 * time.Millisecond
)

// notFoundMessage is what a test says when there is no stripe-mock to run.
var notFoundMessage = "stripe-mock not found: run `make test` or `GOBIN=$PWD/.bin go install github.com/stripe/stripe-mock@" + Version + "`"

// Start runs a private stripe-mock for this test and returns its base URL
// ("http://127.0.0.1:<port>", to be used as the Stripe API base URL). The process is killed at the
// test's cleanup.
//
// It listens on a port the kernel picks (-http-port 0, which also turns stripe-mock's HTTPS
// listener off) and the port is read back from its "Listening for HTTP at address" line, so
// parallel test processes never race for a port. Start returns once the server answered an HTTP
// request, polling for at most startTimeout.
//
// The binary is looked up in this order: $STRIPE_MOCK_BIN, stripe-mock on PATH,
// $(go env GOPATH)/bin/stripe-mock, <repo>/.bin/stripe-mock.
func Start(t testing.TB) string {
	t.Helper()
	bin, err := locate(defaultLookup())
	if err != nil {
		t.Fatal(err)
	}

	out := &addrWatcher{found: make(chan string, 1)}
	cmd := exec.Command(bin, "-http-port", "0")
	cmd.Stdout = out
	cmd.Stderr = out
	setParentDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start stripe-mock %s: %v", bin, err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait() // also ends the goroutine exec uses to copy its output
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	timeout := time.NewTimer(startTimeout)
	defer timeout.Stop()
	var port string
	select {
	case port = <-out.found:
	case <-exited:
		t.Fatalf("stripe-mock %s exited before listening (%v); output:\n%s", bin, waitErr, out.String())
	case <-timeout.C:
		t.Fatalf("stripe-mock %s did not report its address within %s; output:\n%s", bin, startTimeout, out.String())
	}
	base := "http://" + net.JoinHostPort("127.0.0.1", port)

	// The listener is bound before the line is printed, so this normally succeeds at once; the
	// poll covers a server goroutine that has not started serving yet.
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	probe := &http.Client{Transport: tr, Timeout: time.Second}
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		req, err := http.NewRequest(http.MethodGet, base+"/v1/balance", nil)
		if err != nil {
			t.Fatalf("stripe-mock probe: %v", err)
		}
		req.SetBasicAuth(TestKey, "")
		resp, err := probe.Do(req)
		if err == nil {
			resp.Body.Close()
			return base
		}
		select {
		case <-tick.C:
		case <-exited:
			t.Fatalf("stripe-mock exited while starting (%v); output:\n%s", waitErr, out.String())
		case <-timeout.C:
			t.Fatalf("stripe-mock at %s did not answer within %s (last error: %v); output:\n%s", base, startTimeout, err, out.String())
		}
	}
}

// lookup is where locate looks; a struct so the order can be tested without touching the machine.
type lookup struct {
	envBin   string                       // $STRIPE_MOCK_BIN
	lookPath func(string) (string, error) // exec.LookPath
	gopath   func() string                // `go env GOPATH`
	repoRoot func() string                // the directory holding pitlane's go.mod
	isFile   func(string) bool
}

func defaultLookup() lookup {
	return lookup{
		envBin:   os.Getenv(EnvBin),
		lookPath: exec.LookPath,
		gopath:   goPath,
		repoRoot: repoRoot,
		isFile: func(p string) bool {
			st, err := os.Stat(p)
			return err == nil && st.Mode().IsRegular()
		},
	}
}

// locate finds the stripe-mock binary or explains how to get one.
func locate(l lookup) (string, error) {
	if l.envBin != "" {
		if l.isFile(l.envBin) {
			return l.envBin, nil
		}
		// An explicit setting that points nowhere is a broken bench, not a cue to guess.
		return "", fmt.Errorf("%s (%s=%s does not exist)", notFoundMessage, EnvBin, l.envBin)
	}
	if p, err := l.lookPath("stripe-mock"); err == nil {
		return p, nil
	}
	var tried []string
	if gp := l.gopath(); gp != "" {
		// GOPATH may be a list; go install writes to the first entry.
		first := filepath.SplitList(gp)[0]
		p := filepath.Join(first, "bin", "stripe-mock")
		if l.isFile(p) {
			return p, nil
		}
		tried = append(tried, p)
	}
	if root := l.repoRoot(); root != "" {
		p := filepath.Join(root, ".bin", "stripe-mock")
		if l.isFile(p) {
			return p, nil
		}
		tried = append(tried, p)
	}
	return "", fmt.Errorf("%s (looked at $%s, PATH, %s)", notFoundMessage, EnvBin, strings.Join(tried, ", "))
}

func goPath() string {
	out, err := exec.Command("go", "env", "GOPATH").Output()
	if err == nil {
		if gp := strings.TrimSpace(string(out)); gp != "" {
			return gp
		}
	}
	return build.Default.GOPATH
}

// repoRoot walks up from the working directory (a test runs in its package directory) to the
// go.mod of module pitlane.
func repoRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if mod, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && isPitlaneMod(mod) {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

func isPitlaneMod(mod []byte) bool {
	sc := bufio.NewScanner(bytes.NewReader(mod))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "module" {
			return f[1] == "pitlane"
		}
	}
	return false
}

// addrWatcher collects stripe-mock's output and reports the HTTP port from its line
// "Listening for HTTP at address: [::]:41234".
type addrWatcher struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	scanned int
	found   chan string // buffered(1); receives the port once
	sent    bool
}

const listenPrefix = "Listening for HTTP at address: "

func (w *addrWatcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for !w.sent {
		rest := w.buf.Bytes()[w.scanned:]
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		line := strings.TrimSpace(string(rest[:i]))
		w.scanned += i + 1
		if addr, ok := strings.CutPrefix(line, listenPrefix); ok {
			if _, port, err := net.SplitHostPort(addr); err == nil {
				w.found <- port
				w.sent = true
			}
		}
	}
	return len(p), nil
}

func (w *addrWatcher) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}
