// Package static holds the console's CSS, images and scripts, embedded into the binary.
// htmx.min.js is htmx 2.0.11 (npm package htmx.org, Zero-Clause BSD licence), vendored as is.
package static

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"strings"
	"sync"
)

//go:embed *.css *.js
var FS embed.FS

var (
	hashesOnce sync.Once
	hashes     map[string]string
)

// URL is the path of a static file with a content hash in its query, so that pages can let
// browsers cache it forever and still get a new file after a deploy.
func URL(name string) string {
	if h := hashOf(name); h != "" {
		return "/static/" + name + "?v=" + h
	}
	return "/static/" + name
}

// hashOf is the content hash of the file name as this binary has it ("" for none).
func hashOf(name string) string {
	hashesOnce.Do(func() {
		hashes = map[string]string{}
		_ = fs.WalkDir(FS, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := FS.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			hashes[p] = hex.EncodeToString(sum[:6])
			return nil
		})
	})
	return hashes[name]
}

// Handler serves the files under /static/: immutable when asked for by the URL of this binary's
// file (its content hash), revalidated otherwise. A URL with another hash names another
// release's file (a page rendered by a replica on the next or the last binary, during a rolling
// deploy): this replica's file under it was cached for a year, and every page of that release
// ran this one's script (an outside review); now it is served to be revalidated.
func Handler() http.Handler {
	files := http.StripPrefix("/static/", http.FileServerFS(FS))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/") {
			// Files only: no directory listing of what the console ships.
			http.NotFound(w, r)
			return
		}
		if v := r.URL.Query().Get("v"); v != "" && v == hashOf(strings.TrimPrefix(r.URL.Path, "/static/")) {
			w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
		} else {
			w.Header().Set("Cache-Control", "no-cache")
		}
		files.ServeHTTP(w, r)
	})
}
