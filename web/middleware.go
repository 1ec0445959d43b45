package web

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"go.opentelemetry.io/otel/trace"

	"pitlane/handlers"
	"pitlane/payments"
)

// requestLogger writes one structured line per request. The error itself is handed to the
// error handler (HandleError), which decides the status and logs internal errors once.
// Successful probe requests are not logged: balancers send them every few seconds.
func requestLogger(log *slog.Logger) echo.MiddlewareFunc {
	return middleware.RequestLoggerWithConfig(middleware.RequestLoggerConfig{
		HandleError:     true,
		LogStatus:       true,
		LogMethod:       true,
		LogURI:          true,
		LogLatency:      true,
		LogRemoteIP:     true,
		LogRequestID:    true,
		LogResponseSize: true,
		LogValuesFunc: func(c echo.Context, v middleware.RequestLoggerValues) error {
			if v.Status < 400 && (c.Path() == "/healthz" || c.Path() == "/readyz") {
				return nil
			}
			level := slog.LevelInfo
			if v.Status >= 500 {
				level = slog.LevelWarn // the error handler has logged the cause at ERROR
			}
			attrs := []slog.Attr{
				slog.String("method", v.Method),
				slog.String("uri", redactedURI(c.Request().URL)),
				slog.Int("status", v.Status),
				slog.Duration("latency", v.Latency),
				slog.Int64("bytes", v.ResponseSize),
				slog.String("remote_ip", v.RemoteIP),
				slog.String("request_id", v.RequestID),
			}
			// With tracing on, the line names its trace: from a slow or failed request in the
			// log straight to where its time went.
			if sc := trace.SpanContextFromContext(c.Request().Context()); sc.IsSampled() {
				attrs = append(attrs, slog.String("trace_id", sc.TraceID().String()))
			}
			log.LogAttrs(context.Background(), level, "http request", attrs...)
			return nil
		},
	})
}

// panicError carries a recovered panic and its stack to the error handler, which logs both.
type panicError struct {
	value error
	stack string
}

func (p *panicError) Error() string { return "panic: " + p.value.Error() }
func (p *panicError) Unwrap() error { return p.value }

// recoverer turns a panicking handler into a 500 through the normal error path.
func recoverer() echo.MiddlewareFunc {
	return middleware.RecoverWithConfig(middleware.RecoverConfig{
		DisableStackAll:     true,
		DisableErrorHandler: true, // return the error: the request logger hands it to the error handler
		LogErrorFunc: func(c echo.Context, err error, stack []byte) error {
			if err == nil {
				err = fmt.Errorf("nil panic")
			}
			return &panicError{value: err, stack: strings.TrimSpace(string(stack))}
		},
	})
}

// redactedURI is a request's URI for logs: the path, and of the query only its parameter names.
// Query values carry what customers and staff type (a checkout link's contact, a search), and
// logs keep no customer contact in clear.
func redactedURI(u *url.URL) string {
	path := u.EscapedPath()
	if u.RawQuery == "" {
		return path
	}
	var names []string
	for name := range u.Query() {
		names = append(names, url.QueryEscape(name)+"=…")
	}
	slices.Sort(names)
	return path + "?" + strings.Join(names, "&")
}

// Security headers of every answer. The console and the checkout load nothing from elsewhere
// (htmx is served from /static/, there are no inline scripts or styles), so the policy allows
// this origin only; frame-ancestors 'none' (and X-Frame-Options for old browsers) keeps the
// pages out of other sites' frames (clickjacking a Pay or Cancel button). form-action is left
// out on purpose: the checkout's Pay form is answered by a redirect to the gateway's page,
// which browsers would block under form-action 'self'.
const contentSecurityPolicy = "default-src 'self'; frame-ancestors 'none'; base-uri 'self'; object-src 'none'"

// securityHeaders sets them before the handler runs, so errors and 404s carry them too. HSTS
// goes out when the configured public URL is https (echo's Secure middleware would send it only
// for requests that look like TLS here, which they do not behind a TLS-terminating balancer).
func securityHeaders(hsts bool) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			h := c.Response().Header()
			h.Set("Content-Security-Policy", contentSecurityPolicy)
			h.Set("X-Frame-Options", "DENY")
			h.Set("X-Content-Type-Options", "nosniff")
			h.Set("Referrer-Policy", "same-origin")
			if hsts {
				h.Set("Strict-Transport-Security", "max-age=31536000")
			}
			return next(c)
		}
	}
}

// RequestTimeoutFor is the bound of a request's work (Deps.RequestTimeout) for a
// gateway timeout: three gateway calls (a Create's registration, then its answer asked again
// when a newer decision overtook it) and their lock waits fit inside; the server's write timeout
// is WriteMargin longer, so the 503 is written before the connection is dropped.
func RequestTimeoutFor(gatewayTimeout time.Duration) time.Duration {
	return 3*gatewayTimeout + 25*time.Second
}

// WriteMargin is how much longer than RequestTimeoutFor the server's write timeout is: a call
// cut at its bound may still write its refusal's audit entry (payments.RecordGrace) and then its
// answer (answerGrace), and its session's save (auth.SaveGrace); on a silent database each of
// those statements and the one cut first also costs the cancel's grace (payments/dbconn,
// 250 ms): 3 + 2 + 2 + 4 × 0.25 s, inside 10 s.
const WriteMargin = 10 * time.Second

// requestBound gives a request's work a deadline (d 0: none). A database that does not answer —
// a host gone silent, a pool whose connections are all taken — held a call until the client
// gave up or the server's write timeout dropped the connection, with no answer either way; now
// the call's database work is cut at d and answered 503 "unavailable" with Retry-After and
// message. Nothing is half-written: each change is one transaction, and a key whose request was
// cut serves the same request again (Idempotency.Run gives it up as after any outage).
//
// The error is answered here; once the call was cut (or its client went), on a context that
// carries what the handlers put on the request (a console session, whose save the answer
// triggers) with the request's own cancellation (the error handler judges a client's hang-up by
// it) and answerGrace to write in: the page's template and the session's save would fail on the
// ended context.
func requestBound(d time.Duration, message string) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			req := c.Request()
			ctx := req.Context()
			if d > 0 { // d 0: no bound of its own, but a replica's stop is answered all the same
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(req.Context(), d)
				defer cancel()
				c.SetRequest(req.WithContext(ctx))
			}
			err := next(c)
			if err == nil || c.Response().Committed {
				return err
			}
			// Echo's own answers (the binder's 400, a 413) stand whenever they came.
			var he *echo.HTTPError
			// A statement the cut cancelled (57014) reads as busy in the core; here it is the cut.
			stopping := errors.Is(context.Cause(req.Context()), ErrStopping)
			cut := errors.Is(ctx.Err(), context.DeadlineExceeded) && req.Context().Err() == nil
			if (cut || stopping) && !errors.As(err, &he) &&
				(payments.ErrorCode(err) == payments.EINTERNAL || payments.QueryCanceled(err) || stopping && errors.Is(err, context.Canceled)) {
				msg := message
				if stopping {
					msg = stoppingMessage(message)
				}
				err = &payments.Error{Code: payments.EUNAVAIL, Message: msg, Err: err}
			}
			if ctx.Err() != nil {
				parent := req.Context()
				if stopping {
					parent = context.WithoutCancel(parent) // not a hang-up: the answer is written
				}
				actx, acancel := context.WithTimeout(valuesOf{Context: parent, values: c.Request().Context()}, answerGrace)
				defer acancel()
				c.SetRequest(c.Request().WithContext(actx))
			}
			c.Error(err) // within the bound's time when it was not cut
			return nil
		}
	}
}

// answerGrace is how long requestBound's answer may take to write (a session's save on a silent
// database gives up in it): with an audit entry's grace before it, inside WriteMargin.
const answerGrace = 2 * time.Second

// valuesOf is Context (its deadline, cancellation and error) with the values of values.
type valuesOf struct {
	context.Context
	values context.Context
}

func (v valuesOf) Value(key any) any { return v.values.Value(key) }

// The words of a call requestBound cut: an API client's, and a staff member's (a customer's 503
// page says its own: temporary, nothing charged, try again).
const (
	requestTimedOutMessage = "the service's database did not answer in time; try again shortly (with the same Idempotency-Key, if the request had one)"
	pageTimedOutMessage    = "The service's database did not answer in time. Reload the page to see where things stand before you try again."
)

// ErrStopping is the cause a replica's stop cuts the requests still in flight with when its
// shutdown grace ran out (cmd/pitlane serve, through the server's base context): requestBound
// answers them 503 with Retry-After, as it answers a request cut at its own bound, instead of
// the server closing their connections under them with no answer (an outside review: a Check
// asking a slow gateway twice got EOF). What the request started is left as a cut at its bound
// leaves it: each change is one transaction, the patrol looks at what it left under way.
var ErrStopping = errors.New("the replica is stopping")

// stoppingMessage is the answer of a request the stop cut, in the words of its kind (message:
// the API's or the console's timeout message).
func stoppingMessage(message string) string {
	if message == pageTimedOutMessage {
		return "The service was restarting and could not finish this request. Reload the page to see where things stand before you try again."
	}
	return "the service was stopping and could not finish this request; try again shortly (with the same Idempotency-Key, if the request had one)"
}

// canonicalIDs writes the path parameters that name our ids (:id, :challenge) in their canonical
// form (lower case) when they are UUIDs, as PostgreSQL gives them back: the console's changes are
// audited under the payment's id as the handler has it, and one typed in upper case went through
// (a uuid column matches either case) but was filed under a target the payment's page and the
// audit filter never find (an outside review). Never :order_id: an order id is the shop's, and
// an upper-case GUID is one (its checkout link is signed over it as it is).
func canonicalIDs(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		names, vals := c.ParamNames(), slices.Clone(c.ParamValues())
		changed := false
		for i, v := range vals {
			if i >= len(names) || (names[i] != "id" && names[i] != "challenge") {
				continue
			}
			if id, ok := handlers.CanonicalUUID(v); ok && id != v {
				vals[i], changed = id, true
			}
		}
		if changed {
			c.SetParamValues(vals...)
		}
		return next(c)
	}
}
