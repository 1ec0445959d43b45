package views

import (
	"context"

	"pitlane/access"
)

// Viewer is who looks at a page: the signed-in staff user (empty for customers and the sign-in
// page) and the CSRF token every form and htmx request of the page must send back. The web
// layer's middleware puts it in the request context; the layout and the forms read it from
// there, so no page has to pass it down by hand.
type Viewer struct {
	Email string
	Role  access.Role
	CSRF  string
}

// SignedIn reports whether a staff user looks at the page.
func (v Viewer) SignedIn() bool { return v.Email != "" }

// Can reports whether the viewer's role has permission p (false when nobody is signed in).
func (v Viewer) Can(p access.Permission) bool { return v.SignedIn() && v.Role.Can(p) }

type viewerKey struct{}

// WithViewer returns ctx carrying v.
func WithViewer(ctx context.Context, v Viewer) context.Context {
	return context.WithValue(ctx, viewerKey{}, v)
}

// ViewerFrom returns the viewer in ctx (the zero Viewer when there is none).
func ViewerFrom(ctx context.Context) Viewer {
	v, _ := ctx.Value(viewerKey{}).(Viewer)
	return v
}

// CSRFField is the name of the hidden form field that carries the CSRF token; htmx requests
// send the same token in the CSRFHeader header (static/app.js reads it from the page's meta tag).
const (
	CSRFField  = "csrf_token"
	CSRFHeader = "X-CSRF-Token"
)
