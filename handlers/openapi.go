package handlers

import (
	_ "embed"
	"net/http"

	"github.com/labstack/echo/v4"
)

// OpenAPIDocument is the hand-written OpenAPI 3.1 description of /api/v1. A test walks the
// router's routes against it both ways, so it cannot drift from what is registered.
//
//go:embed openapi.json
var OpenAPIDocument []byte

// OpenAPI: GET /api/openapi.json (no authentication: it describes, it reveals nothing).
func OpenAPI(c echo.Context) error {
	c.Response().Header().Set("Cache-Control", "public, max-age=300")
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, OpenAPIDocument)
}
