package static

import (
	"net/http"
	"net/http/httptest"
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
