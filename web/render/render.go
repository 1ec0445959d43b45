// Package render writes templ components as responses. It is separate from package web so
// that handlers (which web's routes import) can use it too.
package render

import (
	"bytes"
	"fmt"

	"github.com/a-h/templ"
	"github.com/labstack/echo/v4"
)

// HTML renders comp into a buffer first and writes it only when rendering succeeded: a
// template error then reaches the error handler while nothing has been sent, and becomes a
// proper error page instead of half a page with a 200.
func HTML(c echo.Context, status int, comp templ.Component) error {
	var buf bytes.Buffer
	if err := comp.Render(c.Request().Context(), &buf); err != nil {
		return fmt.Errorf("render %s: %w", c.Path(), err)
	}
	return c.HTMLBlob(status, buf.Bytes())
}

// Fragments renders only the templ.Fragment parts of comp named by ids (for htmx swaps), so
// one page component serves both the full page and its partial updates.
func Fragments(c echo.Context, status int, comp templ.Component, ids ...any) error {
	var buf bytes.Buffer
	if err := templ.RenderFragments(c.Request().Context(), &buf, comp, ids...); err != nil {
		return fmt.Errorf("render fragments %s: %w", c.Path(), err)
	}
	return c.HTMLBlob(status, buf.Bytes())
}
