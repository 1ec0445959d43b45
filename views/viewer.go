package views

import (
	"context"
	"strconv"
	"time"

	"github.com/a-h/templ"

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

// LiveHeader marks the requests static/live.js makes to refresh a page's live region: the
// page's own requests, not the user's (the console's idle timeout does not count them).
const LiveHeader = "X-Pitlane-Live"

type liveKey struct{}

// WithLive returns ctx carrying the live hub's position when the page was read (handlers.Live
// marks every page request with it).
func WithLive(ctx context.Context, since string) context.Context {
	return context.WithValue(ctx, liveKey{}, since)
}

// LiveOn reports whether the page is read with live updates on (a page's live region then
// updates itself: LiveRegion).
func LiveOn(ctx context.Context) bool {
	_, ok := ctx.Value(liveKey{}).(string)
	return ok
}

// LiveRegion is the attributes of a page's live region: the stream static/live.js opens for it,
// and the position the page was read at (so the stream can say at once that something changed
// in between). Without a position (live updates are off) the region is a plain part of the
// page.
func LiveRegion(ctx context.Context, stream string) templ.Attributes {
	since, ok := ctx.Value(liveKey{}).(string)
	if !ok {
		return nil
	}
	return templ.Attributes{"data-live": stream, "data-live-since": since}
}

// LiveDue is the attribute of a live region whose content changes by the clock alone, at at
// (nil: nothing is due): a payment turning stuck by its age writes nothing, so no stream says
// so. data-live-due is the milliseconds from now (when the page was read) until then;
// static/live.js fetches the region once then, and each render says it anew. Relative, so the
// browser's clock does not matter. Nothing without live updates (as LiveRegion).
func LiveDue(ctx context.Context, at *time.Time, now time.Time) templ.Attributes {
	if _, ok := ctx.Value(liveKey{}).(string); !ok || at == nil {
		return nil
	}
	return templ.Attributes{"data-live-due": strconv.FormatInt(max(at.Sub(now), 0).Milliseconds(), 10)}
}
