package web

import (
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"pitlane/access"
	"pitlane/handlers"
	"pitlane/live"
	"pitlane/static"
	"pitlane/web/auth"
)

// routes registers every route of the server, in one place, so that the whole URL surface
// can be read top to bottom.
func routes(e *echo.Echo, d Deps) {
	health := handlers.NewHealth(d.DB)
	health.ClockSynced = d.ClockSynced
	health.Stopping = d.Stopping
	e.GET("/healthz", health.Healthz)
	e.GET("/readyz", health.Readyz)

	e.GET("/static/*", echo.WrapHandler(static.Handler()))
	if !d.MetricsElsewhere {
		e.GET("/metrics", d.Metrics.handler(d.Logger))
	}

	// The gateway's signed events (contract: pitlane-api.md "Webhook receiver"). No session,
	// CSRF or body-reading middleware may run before it: the signature covers the raw body.
	e.POST("/webhooks/gateway", handlers.NewWebhooks(d.Payments, d.Webhooks, d.Logger).Receive)

	// JSON API (contract: shared/contracts/pitlane-api.md). Every /api/v1 call needs a bearer
	// API key with the scope its route names (the OpenAPI document lists the same scopes); the
	// document describing them needs none. Errors become problem+json in errors.go.
	// Authentication is per route, not group middleware, so an unknown path stays a plain 404.
	api := handlers.NewAPI(d.Payments, d.Access, d.Idempotency, d.Logger)
	// Each call's work is bounded first (requestBound), its key's look-up included.
	bound := requestBound(d.RequestTimeout, requestTimedOutMessage)
	read := []echo.MiddlewareFunc{bound, api.Authenticate(access.ScopePaymentsRead)}
	write := []echo.MiddlewareFunc{bound, api.Authenticate(access.ScopePaymentsWrite)}
	refund := []echo.MiddlewareFunc{bound, api.Authenticate(access.ScopeRefundsWrite)}
	e.GET("/api/openapi.json", handlers.OpenAPI)
	v1 := e.Group("/api/v1")
	v1.POST("/orders/:order_id/payments", api.CreatePayment, write...)
	v1.POST("/orders/:order_id/checkout-links", api.CreateCheckoutLink, write...)
	v1.GET("/orders/:order_id", api.GetOrder, read...)
	v1.GET("/payments/:id", api.GetPayment, read...)
	v1.POST("/payments/:id/check", api.CheckPayment, write...)
	v1.POST("/payments/:id/cancel", api.CancelPayment, write...)
	v1.POST("/payments/:id/cancel/confirm", api.ConfirmCancel, write...)
	v1.POST("/payments/:id/refunds", api.CreateRefund, refund...)
	v1.GET("/payments/:id/refunds", api.ListRefunds, read...)
	v1.GET("/payments/:id/events", api.ListPaymentEvents, read...)
	v1.GET("/refunds/:id", api.GetRefund, read...)
	v1.GET("/events", api.ListEvents, read...)

	// People's pages: the staff console and the customer's checkout. Sessions live in
	// PostgreSQL (every replica shares them); every unsafe request carries a CSRF token
	// (per session when signed in, cookie-bound otherwise). Roles: access.Role.Can.
	am := auth.New(auth.Config{DB: d.DB, Access: d.Access, Secret: d.SecretKey, SecretFallbacks: d.SecretKeyFallbacks, Secure: d.SecureCookies, Logger: d.Logger,
		IdleTimeout: d.ConsoleIdleTimeout, Now: d.SessionClock})
	// Route-level rather than a group over "/", so unknown paths and other methods stay plain
	// 404/405 without a session lookup.
	lv := handlers.NewLive(d.Live, d.Payments, d.Logger, am.Still)
	// A page's work is bounded as an API call's is, its session's load included: a database
	// that does not answer is a readable 503 page, not a connection dropped at the write
	// timeout. Not the live streams, the CSV exports and the stuck list's bulk check: they run
	// longer by design and move their own write deadlines.
	chain := func(bound echo.MiddlewareFunc, m []echo.MiddlewareFunc) []echo.MiddlewareFunc {
		return append([]echo.MiddlewareFunc{bound, middleware.BodyLimit("64K"), am.Sessions(), am.CSRF(), lv.Mark, canonicalIDs}, m...)
	}
	pageBound := requestBound(d.RequestTimeout, pageTimedOutMessage)
	pages := func(m ...echo.MiddlewareFunc) []echo.MiddlewareFunc { return chain(pageBound, m) }
	long := func(m ...echo.MiddlewareFunc) []echo.MiddlewareFunc {
		return chain(requestBound(0, pageTimedOutMessage), m)
	}
	con := handlers.NewConsole(d.Payments, d.Access, am, d.ReplicaID, d.Logger)
	view, operate := am.Require(access.PermView), am.Require(access.PermOperate)
	finance, resolve, admin := am.Require(access.PermFinance), am.Require(access.PermResolve), am.Require(access.PermAdmin)
	e.GET("/login", con.LoginPage, pages()...)
	e.POST("/login", con.Login, pages()...)
	e.POST("/logout", con.Logout, pages()...)
	e.GET("/", con.Dashboard, pages(view)...)
	e.GET("/account", con.Account, pages(view)...)
	e.POST("/account/password", con.ChangePassword, pages(view)...)
	e.POST("/account/sessions", con.EndOtherSessions, pages(view)...)
	e.GET("/payments", con.Payments, pages(view)...)
	e.GET("/payments/new", con.NewPayment, pages(operate)...)
	e.POST("/payments", con.CreatePayment, pages(operate)...)
	e.GET("/payments/:id", con.Payment, pages(view)...)
	e.POST("/payments/:id/check", con.CheckPayment, pages(operate)...)
	e.POST("/payments/:id/cancel", con.RequestCancel, pages(operate)...)
	e.POST("/payments/:id/cancel/:challenge", con.ConfirmCancel, pages(operate)...)
	e.POST("/payments/:id/refunds/code", con.RequestRefundCode, pages(operate)...)
	e.POST("/payments/:id/refunds/code/:challenge", con.ConfirmRefund, pages(operate)...)
	e.POST("/payments/:id/refunds", con.RefundPayment, pages(resolve)...)
	e.POST("/payments/:id/codes/unlock", con.UnlockCodes, pages(resolve)...)
	e.GET("/finance", con.Finance, pages(finance)...)
	e.GET("/finance/cases", con.Cases, pages(finance)...)
	e.POST("/finance/cases/:id/resolve", con.ResolveCase, pages(resolve)...)
	e.GET("/finance/flagged", con.Flagged, pages(finance)...)
	e.POST("/finance/flagged/:id/retry", con.RetryFlagged, pages(resolve)...)
	e.POST("/finance/flagged/refunds/:id/retry", con.RetryFlaggedRefund, pages(resolve)...)
	e.POST("/finance/flagged/refunds/:id/propose", con.ProposeRefundOutcome, pages(resolve)...)
	e.GET("/finance/ledger", con.Ledger, pages(finance)...)
	e.GET("/finance/ledger.csv", con.LedgerCSV, long(finance)...)
	e.GET("/finance/stuck", con.Stuck, pages(finance)...)
	e.POST("/finance/stuck/check", con.CheckStuck, long(resolve)...)
	e.GET("/finance/resolutions", con.Resolutions, pages(finance)...)
	e.GET("/finance/resolutions/new", con.NewResolution, pages(resolve)...)
	e.POST("/finance/resolutions", con.ProposeResolution, pages(resolve)...)
	e.POST("/finance/resolutions/:id/approve", con.ApproveResolution, pages(resolve)...)
	e.POST("/finance/resolutions/:id/reject", con.RejectResolution, pages(resolve)...)
	e.GET("/locks", con.Locks, pages(view)...)
	e.GET("/ops", con.Ops, pages(view)...)
	e.POST("/ops/events-webhook/retry", con.RetryEventsWebhook, pages(admin)...)
	e.GET("/outbox", con.Outbox, pages(admin)...)
	e.GET("/admin/users", con.Users, pages(admin)...)
	e.POST("/admin/users/:id/disable", con.DisableUser, pages(admin)...)
	e.POST("/admin/users/:id/enable", con.EnableUser, pages(admin)...)
	e.POST("/admin/users/:id/role", con.SetUserRole, pages(admin)...)
	e.POST("/admin/users/:id/password", con.SetUserPassword, pages(admin)...)
	e.GET("/admin/audit", con.Audit, pages(admin)...)
	e.GET("/admin/audit.csv", con.AuditCSV, long(admin)...)
	// Live streams (server-sent events): each behind the role check of the page it feeds.
	e.GET("/live/dashboard", lv.Stream(live.PageDashboard), long(view)...)
	e.GET("/live/payments", lv.Stream(live.PagePayments), long(view)...)
	e.GET("/live/payments/:id", lv.Payment, long(view)...)
	e.GET("/live/locks", lv.Stream(live.PageLocks), long(view)...)
	e.GET("/live/finance/stuck", lv.Stream(live.PageStuck), long(finance)...)
	e.GET("/live/finance/cases", lv.Stream(live.PageCases), long(finance)...)
	e.GET("/live/finance/flagged", lv.Stream(live.PageFlagged), long(finance)...)
	e.GET("/live/finance/resolutions", lv.Stream(live.PageResolutions), long(finance)...)
	e.GET("/live/finance/ledger", lv.Stream(live.PageLedger), long(finance)...)

	checkout := handlers.NewCheckout(d.Payments, d.Idempotency, d.MerchantName, d.Logger)
	e.GET("/checkout/:order_id", checkout.Page, pages()...)
	e.POST("/checkout/:order_id", checkout.Pay, pages()...)
	e.GET("/checkout/:order_id/return", checkout.Return, pages()...)
}
