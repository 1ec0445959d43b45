package stripemock

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestStart proves the bench gives a live stripe-mock that validates requests: a known request
// is answered, an unknown parameter is refused with 400.
func TestStart(t *testing.T) {
	t.Parallel()
	base := Start(t)

	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr}
	post := func(form url.Values) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, base+"/v1/payment_intents", strings.NewReader(form.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		req.SetBasicAuth(TestKey, "")
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := post(url.Values{"amount": {"1999"}, "currency": {"eur"}}); got != http.StatusOK {
		t.Fatalf("valid create: HTTP %d, want 200", got)
	}
	if got := post(url.Values{"amount": {"1999"}, "currency": {"eur"}, "no_such_param": {"1"}}); got != http.StatusBadRequest {
		t.Fatalf("create with an unknown parameter: HTTP %d, want 400 (validation is off?)", got)
	}
}

// TestStartWithoutBinaryFails: a missing binary must fail the test with the how-to message,
// never skip it.
func TestStartWithoutBinaryFails(t *testing.T) {
	t.Setenv(EnvBin, filepath.Join(t.TempDir(), "no-stripe-mock"))
	ft := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Start(ft)
	}()
	<-done
	if !ft.failed {
		t.Fatal("Start returned without failing")
	}
	if ft.skipped {
		t.Fatal("Start skipped; it must fail")
	}
	if !strings.Contains(ft.msg, notFoundMessage) {
		t.Fatalf("failure message %q does not say how to install stripe-mock", ft.msg)
	}
}

// fatalTB records Fatal/Skip instead of ending the real test, then stops the calling goroutine
// the way testing does.
type fatalTB struct {
	testing.TB
	mu      sync.Mutex
	failed  bool
	skipped bool
	msg     string
}

func (f *fatalTB) Helper()                           {}
func (f *fatalTB) Fatal(args ...any)                 { f.record(false, fmt.Sprint(args...)) }
func (f *fatalTB) Fatalf(format string, args ...any) { f.record(false, fmt.Sprintf(format, args...)) }
func (f *fatalTB) Skip(args ...any)                  { f.record(true, fmt.Sprint(args...)) }
func (f *fatalTB) Skipf(format string, args ...any)  { f.record(true, fmt.Sprintf(format, args...)) }
func (f *fatalTB) SkipNow()                          { f.record(true, "SkipNow") }
func (f *fatalTB) FailNow()                          { f.record(false, "FailNow") }

func (f *fatalTB) record(skip bool, msg string) {
	f.mu.Lock()
	f.failed, f.skipped = !skip, skip
	f.msg = msg
	f.mu.Unlock()
	runtime.Goexit()
}

func TestLocate(t *testing.T) {
	t.Parallel()
	notOnPath := func(string) (string, error) { return "", errors.New("not found") }
	files := func(paths ...string) func(string) bool {
		return func(p string) bool {
			for _, q := range paths {
				if p == q {
					return true
				}
			}
			return false
		}
	}
	base := lookup{
		lookPath: notOnPath,
		gopath:   func() string { return "/gp" + string(filepath.ListSeparator) + "/other" },
		repoRoot: func() string { return "/repo" },
		isFile:   files(),
	}
	tests := []struct {
		name    string
		mod     func(*lookup)
		want    string
		wantErr string
	}{
		{"env wins", func(l *lookup) {
			l.envBin = "/custom/sm"
			l.isFile = files("/custom/sm", "/gp/bin/stripe-mock")
			l.lookPath = func(string) (string, error) { return "/usr/bin/stripe-mock", nil }
		}, "/custom/sm", ""},
		{"env set but missing fails, no guessing", func(l *lookup) {
			l.envBin = "/custom/sm"
			l.isFile = files("/gp/bin/stripe-mock")
		}, "", "STRIPE_MOCK_BIN=/custom/sm does not exist"},
		{"PATH", func(l *lookup) {
			l.lookPath = func(string) (string, error) { return "/usr/bin/stripe-mock", nil }
			l.isFile = files("/gp/bin/stripe-mock")
		}, "/usr/bin/stripe-mock", ""},
		{"GOPATH/bin, first entry", func(l *lookup) {
			l.isFile = files("/gp/bin/stripe-mock", "/repo/.bin/stripe-mock")
		}, "/gp/bin/stripe-mock", ""},
		{"repo .bin", func(l *lookup) {
			l.isFile = files("/repo/.bin/stripe-mock")
		}, "/repo/.bin/stripe-mock", ""},
		{"nowhere", func(*lookup) {}, "", "/gp/bin/stripe-mock, /repo/.bin/stripe-mock"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l := base
			tc.mod(&l)
			got, err := locate(l)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("locate = %q, want an error", got)
				}
				if !strings.Contains(err.Error(), notFoundMessage) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %q lacks the how-to message or %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("locate = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestRepoRoot: the walk up from the package directory ends at pitlane's go.mod.
func TestRepoRoot(t *testing.T) {
	t.Parallel()
	root := repoRoot()
	if root == "" {
		t.Fatal("repoRoot() found no go.mod of module pitlane")
	}
	if _, err := os.Stat(filepath.Join(root, "internal", "stripemock", "stripemock.go")); err != nil {
		t.Fatalf("repoRoot() = %q, which does not hold this package: %v", root, err)
	}
}
