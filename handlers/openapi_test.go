package handlers_test

import (
	"encoding/json"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"testing"

	"pitlane/handlers"
	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/web"
)

// Every /api/v1 route the server registers is in the OpenAPI document, and every operation the
// document describes is registered: the document cannot drift from the router.
func TestOpenAPIDocumentMatchesRoutes(t *testing.T) {
	t.Parallel()
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(handlers.OpenAPIDocument, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.1") {
		t.Fatalf("openapi version %q, want 3.1.x", doc.OpenAPI)
	}
	documented := map[string]bool{}
	for path, ops := range doc.Paths {
		for method := range ops {
			switch method {
			case "get", "put", "post", "delete", "patch", "head", "options", "trace":
				documented[strings.ToUpper(method)+" "+path] = true
			}
		}
	}

	e := web.New(web.Deps{Payments: payments.NewService(testdb.Unreachable(t), payments.Config{})})
	param := regexp.MustCompile(`:([A-Za-z_]+)`)
	registered := map[string]bool{}
	for _, r := range e.Routes() {
		if !strings.HasPrefix(r.Path, "/api/v1/") {
			continue
		}
		registered[r.Method+" "+param.ReplaceAllString(r.Path, "{$1}")] = true
	}
	if len(registered) == 0 {
		t.Fatal("no /api/v1 routes registered")
	}
	var missing, extra []string
	for op := range registered {
		if !documented[op] {
			missing = append(missing, op)
		}
	}
	for op := range documented {
		if !registered[op] {
			extra = append(extra, op)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 {
		t.Errorf("registered but not documented: %v", missing)
	}
	if len(extra) > 0 {
		t.Errorf("documented but not registered: %v", extra)
	}

	// Served as JSON, without a key.
	rec := (&apiBench{e: e}).on(e, get("/api/openapi.json", "Authorization", ""))
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") {
		t.Fatalf("GET /api/openapi.json = %d %s", rec.Code, rec.Header().Get("Content-Type"))
	}
}
