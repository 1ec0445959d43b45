package pgrunner

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// InstallHint is the one command that provides the server binaries on Debian and Ubuntu.
const InstallHint = "apt-get install -y postgresql"

// ErrNotFound is returned (wrapped in a message naming the package to install) when initdb or
// postgres cannot be found.
var ErrNotFound = errors.New("PostgreSQL server binaries not found")

// Search says where to look for the server binaries: first every directory of PATH (a
// PATH-style list), then every directory matching one of Globs, highest version first.
type Search struct {
	PATH  string
	Globs []string
}

// DefaultSearch is the caller's PATH, then Debian's versioned directories, which are not on
// PATH by default (the postgresql package only links client tools into /usr/bin).
func DefaultSearch() Search {
	return Search{PATH: os.Getenv("PATH"), Globs: []string{"/usr/lib/postgresql/*/bin"}}
}

// Binaries are the server programs of one PostgreSQL installation. pg_ctl is deliberately not
// used: it daemonizes the postmaster, which would then outlive us if we were killed; we run
// postgres as our own child instead (see Start).
type Binaries struct {
	Dir      string // directory holding both programs
	Initdb   string
	Postgres string
}

// FindBinaries locates initdb and the postgres server that belongs to it (initdb itself
// insists on a postgres of its own version in its own directory, so a symlinked initdb is
// resolved to its real directory first).
func FindBinaries(s Search) (Binaries, error) {
	var dirs []string
	for _, d := range filepath.SplitList(s.PATH) {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	for _, g := range s.Globs {
		matches, _ := filepath.Glob(g)
		sort.Slice(matches, func(i, j int) bool { return versionOf(matches[i]) > versionOf(matches[j]) })
		dirs = append(dirs, matches...)
	}
	for _, d := range dirs {
		initdb := filepath.Join(d, "initdb")
		if !isExecutable(initdb) {
			continue
		}
		real, err := filepath.EvalSymlinks(initdb)
		if err != nil {
			continue
		}
		realDir := filepath.Dir(real)
		for _, pd := range []string{realDir, d} {
			pg := filepath.Join(pd, "postgres")
			if isExecutable(pg) {
				return Binaries{Dir: realDir, Initdb: real, Postgres: pg}, nil
			}
		}
	}
	return Binaries{}, fmt.Errorf("pgrunner: %w (initdb and postgres on PATH or in /usr/lib/postgresql/*/bin); install them with: %s", ErrNotFound, InstallHint)
}

// Version returns the major version of the server binaries (e.g. "15").
func (b Binaries) Version() (string, error) {
	out, err := exec.Command(b.Postgres, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("pgrunner: %s --version: %w", b.Postgres, err)
	}
	// "postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)"
	fields := strings.Fields(string(out))
	if len(fields) < 3 {
		return "", fmt.Errorf("pgrunner: unexpected version output %q", out)
	}
	v := fields[2]
	major, _, _ := strings.Cut(v, ".")
	return major, nil
}

// versionOf extracts the number from /usr/lib/postgresql/<n>/bin for sorting; 0 if none.
func versionOf(dir string) float64 {
	v, err := strconv.ParseFloat(filepath.Base(filepath.Dir(dir)), 64)
	if err != nil {
		return 0
	}
	return v
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// Tool returns the path of another program of this installation that lives beside initdb (e.g.
// "pgbench", which Debian ships in the same server package), or an error naming the package.
func (b Binaries) Tool(name string) (string, error) {
	p := filepath.Join(b.Dir, name)
	if !isExecutable(p) {
		return "", fmt.Errorf("pgrunner: %w: no %s beside %s; install it with: %s", ErrNotFound, name, b.Initdb, InstallHint)
	}
	return p, nil
}
