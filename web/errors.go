package web

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"pitlane/handlers"
	"pitlane/payments"
	"pitlane/views"
	"pitlane/web/render"
)

// Problem is an RFC 9457 problem document, the body of every error under /api/.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code,omitempty"`  // the domain error code (payments.ECONFLICT, …)
	Field  string `json:"field,omitempty"` // for invalid input: which field
}

// domainStatus is THE mapping of domain error codes to HTTP status; nothing else in pitlane
// decides a status from an error.
var domainStatus = map[string]int{
	payments.EINVALID:  http.StatusUnprocessableEntity,
	payments.ENOTFOUND: http.StatusNotFound,
	payments.ECONFLICT: http.StatusConflict,
	payments.EEXPIRED:  http.StatusGone,
	payments.ELOCKED:   http.StatusTooManyRequests,
	payments.EWRONG:    http.StatusUnprocessableEntity,
	payments.EBUSY:     http.StatusConflict,
	payments.EUNAVAIL:  http.StatusServiceUnavailable,
	payments.EINTERNAL: http.StatusInternalServerError,

	payments.EUNAUTHENTICATED: http.StatusUnauthorized,
	payments.EFORBIDDEN:       http.StatusForbidden,

	payments.EMALFORMED:    http.StatusBadRequest,
	payments.EBADSIGNATURE: http.StatusUnauthorized,
}

// retryAfterSeconds is sent with EBUSY (the same work is running elsewhere) and EUNAVAIL: long
// enough for a short transaction to finish, short enough for an interactive retry.
const retryAfterSeconds = "1"

// problemFor builds the problem document for err: from an echo.HTTPError (routing, binding, body
// limit) or from a domain error. Internal errors get a generic detail: their text may hold
// SQL or other internals and is logged instead.
func problemFor(err error) Problem {
	var he *echo.HTTPError
	if errors.As(err, &he) {
		p := Problem{Type: "about:blank", Status: he.Code, Title: http.StatusText(he.Code)}
		if he.Code < 500 {
			if m, ok := he.Message.(string); ok && m != p.Title {
				p.Detail = m
			} else if he.Message != nil && he.Message != p.Title {
				p.Detail = fmt.Sprint(he.Message)
			}
		} else {
			p.Detail = "internal error"
		}
		if p.Detail == "" {
			p.Detail = p.Title
		}
		return p
	}
	code := payments.ErrorCode(err)
	status, ok := domainStatus[code]
	if !ok {
		code, status = payments.EINTERNAL, http.StatusInternalServerError
	}
	p := Problem{Type: "urn:pitlane:error:" + code, Status: status, Title: http.StatusText(status), Code: code, Detail: payments.ErrorMessage(err)}
	var de *payments.Error
	if errors.As(err, &de) {
		p.Field = de.Field
	}
	return p
}

// statusClientClosed is the status of a request whose client hung up before its answer.
const statusClientClosed = 499

// errorHandler is Echo's one error handler: status from problemFor, problem+json for machine
// paths, an HTML page for people, and a log line only for internal errors.
func errorHandler(log *slog.Logger, replicaID, merchant string, svc *payments.Service) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		p := problemFor(err)
		req := c.Request()
		if (errors.Is(err, context.Canceled) || payments.QueryCanceled(err)) && req.Context().Err() != nil {
			// The client hung up (its own timeout, a closed tab): nothing is broken, and nobody
			// reads the answer. 499, as nginx logs it, keeps it out of the 5xx that
			// PitlaneHTTPErrors counts as bugs, out of the WARN request log and the error span
			// (an outside review: each hang-up was a 500).
			p.Status, p.Title = statusClientClosed, "Client Closed Request"
		}
		if p.Status >= 500 && p.Status != http.StatusServiceUnavailable {
			attrs := []slog.Attr{
				slog.String("method", req.Method),
				slog.String("uri", redactedURI(req.URL)),
				slog.String("request_id", c.Response().Header().Get(echo.HeaderXRequestID)),
				slog.String("error", err.Error()),
			}
			var pe *panicError
			if errors.As(err, &pe) {
				attrs = append(attrs, slog.String("stack", pe.stack))
			}
			log.LogAttrs(req.Context(), slog.LevelError, "internal error", attrs...)
		}
		if ra := retryAfter(err, p); ra != "" {
			c.Response().Header().Set("Retry-After", ra)
		}
		if p.Status == http.StatusMethodNotAllowed {
			allowHead(c.Response().Header(), req.URL.Path)
		}

		var werr error
		switch {
		case req.Method == http.MethodHead:
			werr = c.NoContent(p.Status)
		case machinePath(req.URL.Path):
			c.Response().Header().Set(echo.HeaderContentType, "application/problem+json")
			c.Response().WriteHeader(p.Status)
			werr = jsonEncode(c, p)
		case checkoutPath(req.URL.Path):
			werr = checkoutError(c, p, merchant, svc)
		default:
			werr = htmlError(c, p, replicaID)
		}
		if werr != nil {
			log.Error("writing error response", slog.String("error", werr.Error()))
		}
	}
}

// retryAfter is the Retry-After value for an error: the domain error's own RetryAfter when it
// names one (a limit that lapses at a known time, e.g. a payment's one-time code budget), in
// whole seconds rounded up; the short default for EBUSY and every 503 (a database outage, a lock
// timeout); "" otherwise.
func retryAfter(err error, p Problem) string {
	if d := payments.RetryAfter(err); d > 0 {
		return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
	}
	if p.Code == payments.EBUSY || p.Status == http.StatusServiceUnavailable {
		return retryAfterSeconds
	}
	return ""
}

// machinePath: clients that read JSON, not people.
func machinePath(path string) bool {
	return strings.HasPrefix(path, "/api/") || strings.HasPrefix(path, "/webhooks/")
}

func jsonEncode(c echo.Context, p Problem) error {
	enc := c.Echo().JSONSerializer
	return enc.Serialize(c, p, "")
}

// checkoutPath: the customer's pages, whose errors are the customer's error page (the
// merchant's name, no console links).
func checkoutPath(path string) bool { return strings.HasPrefix(path, "/checkout/") }

// checkoutError is the customer's face of an error: what to do next in their words, and a way
// back to the order's page (not for an order that is not there).
func checkoutError(c echo.Context, p Problem, merchant string, svc *payments.Service) error {
	back := ""
	if id := handlers.PathParam(c, "order_id"); id != "" && p.Status != http.StatusNotFound {
		back = orderPageBack(c, svc, payments.CheckoutPathOrderID(id))
	}
	hdr := c.Response().Header()
	hdr.Set("Cache-Control", "no-store")
	var again views.CheckoutUpdates
	if p.Status == http.StatusServiceUnavailable && looking(c.Request().Method) && back != "" {
		// A look that met an outage looks again by itself (a browser ignores Retry-After on a
		// page): a waiting page keeps updating through a moment without its database.
		if u, ok := handlers.LookAgain(back); ok {
			again = u
			hdr.Set("Refresh", strconv.Itoa(u.RefreshSeconds())+"; url="+u.Next)
		}
	}
	if err := render.HTML(c, p.Status, views.CheckoutError(merchant, p.Status, p.Detail, back, looking(c.Request().Method), again)); err != nil {
		return c.String(p.Status, fmt.Sprintf("%d %s\n%s\n", p.Status, p.Title, p.Detail))
	}
	return nil
}

// looking: a request that only looks (GET, HEAD), whose failure says nothing of what was paid.
func looking(method string) bool { return method == http.MethodGet || method == http.MethodHead }

func htmlError(c echo.Context, p Problem, replicaID string) error {
	page := views.Page{Title: p.Title, ReplicaID: replicaID}
	if err := render.HTML(c, p.Status, views.ErrorPage(page, p.Status, p.Detail)); err != nil {
		return c.String(p.Status, fmt.Sprintf("%d %s\n%s\n", p.Status, p.Title, p.Detail))
	}
	return nil
}

// orderPageBack is an error page's way back to the order's checkout page, revealing nothing the
// request did not hold (the page opens only with a link or the order's page token): a GET goes
// back to the order's page with the query it asked with (re-encoded, on our own path: the link
// is rendered as a trusted URL); a Pay click (refused before its handler ran, a CSRF 403, or
// by the core, a lock timeout's 503 or the order's budget's 429) to the page its form came
// from: the checkout link the form carried when it is one of this order's (its
// amount, currency, exp and sig, and the contact prefill), else the order's page with the page
// token the form carried (the page's retry form); anything else to the bare page. The order's
// page token alone would not do for a link's form: an order with no payment yet offers nothing
// without its link, and says the link is incomplete or changed.
func orderPageBack(c echo.Context, svc *payments.Service, orderID string) string {
	r := c.Request()
	if r.Method == http.MethodGet {
		if q := r.URL.Query().Encode(); q != "" {
			return payments.CheckoutPath(orderID) + "?" + q
		}
		return payments.CheckoutPath(orderID)
	}
	if svc == nil {
		return payments.CheckoutPath(orderID)
	}
	if q, ok := formLink(r, svc, orderID); ok {
		return payments.CheckoutPath(orderID) + "?" + q.Encode()
	}
	if svc.VerifyOrderPageToken(orderID, r.PostFormValue(payments.OrderPageParam)) {
		return svc.OrderPagePath(orderID, nil)
	}
	return payments.CheckoutPath(orderID)
}

// formLink is the checkout link a Pay form carried, as the query of the link's page (amount,
// currency, exp, gen, gsig, sig and the contact prefill), when it is a genuine link of the order (an
// expired one too: its page says so, as the link itself does).
func formLink(r *http.Request, svc *payments.Service, orderID string) (url.Values, bool) {
	amount, aerr := strconv.ParseInt(strings.TrimSpace(r.PostFormValue("amount")), 10, 64)
	exp, eerr := strconv.ParseInt(r.PostFormValue("exp"), 10, 64)
	gen, gerr := payments.CheckoutLinkGeneration(r.PostForm)
	if aerr != nil || eerr != nil || gerr != nil {
		return nil, false
	}
	err := svc.VerifyCheckoutLink(orderID, amount, strings.ToUpper(r.PostFormValue("currency")), exp, gen, r.PostFormValue("sig"), r.PostFormValue("gsig"))
	if err != nil && payments.ErrorCode(err) != payments.EEXPIRED {
		return nil, false
	}
	q := url.Values{}
	for _, k := range slices.Concat(payments.CheckoutLinkParams, []string{"contact"}) {
		if v := r.PostFormValue(k); v != "" {
			q.Set(k, v)
		}
	}
	return q, true
}

// allowHead adds HEAD to a 405's Allow where the path serves GET: Echo's router lists the routes'
// methods, and headAsGet serves HEAD wherever GET is, except on the GETs with effects.
func allowHead(h http.Header, path string) {
	allow := h.Get(echo.HeaderAllow)
	if getWithEffects[path] || allow == "" {
		return
	}
	methods := strings.Split(allow, ", ")
	if slices.Contains(methods, http.MethodHead) || !slices.Contains(methods, http.MethodGet) {
		return
	}
	h.Set(echo.HeaderAllow, allow+", "+http.MethodHead)
}
