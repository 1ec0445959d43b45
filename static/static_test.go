package static

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Files only: /static/ and its folders list nothing (an outside audit found the listing).
func TestHandlerServesFilesNotListings(t *testing.T) {
	h := Handler()
	for path, want := range map[string]int{"/static/app.css": http.StatusOK, "/static/": http.StatusNotFound, "/static/app.css/": http.StatusNotFound} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != want {
			t.Errorf("GET %s = %d, want %d", path, rec.Code, want)
		}
	}
}

// During a rolling deploy a page rendered by the new binary names /static/live.js?v=<new hash>;
// the balancer may send that GET to a replica still on the old binary. It served its old file
// "immutable, one year" under the new release's URL: the browser (and any shared cache) kept the
// old script for it, and every page of the new release ran it. Only this binary's hash is
// immutable now. An outside review (replicas); negative control: any v immutable, as before.
func TestAnotherReleasesHashIsNotCachedForever(t *testing.T) {
	own := URL("live.js")
	_, ownV, _ := strings.Cut(own, "?v=")
	h := Handler()

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, own, nil))
	if !strings.Contains(rec.Header().Get("Cache-Control"), "immutable") {
		t.Fatalf("own hash %s: Cache-Control %q, want immutable", ownV, rec.Header().Get("Cache-Control"))
	}

	other := "/static/live.js?v=0123456789ab" // another release's content hash of live.js
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, other, nil))
	if cc := rec.Header().Get("Cache-Control"); rec.Code == http.StatusOK && strings.Contains(cc, "immutable") {
		t.Fatalf("GET %s (not this binary's hash %s) = 200 with Cache-Control %q: this replica's live.js is cached for a year under another release's URL", other, ownV, cc)
	}
}
