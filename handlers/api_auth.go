package handlers

import (
	"strings"

	"github.com/labstack/echo/v4"

	"pitlane/access"
	"pitlane/payments"
)

const clientContextKey = "pitlane.api_client"

// ClientFrom returns the API client the request was authenticated as (zero outside /api/v1).
func ClientFrom(c echo.Context) access.APIClient {
	cl, _ := c.Get(clientContextKey).(access.APIClient)
	return cl
}

// Authenticate is the bearer-key middleware of /api/v1 for a route that needs scope (routes.go
// names it per route, so handlers never check scopes themselves). A missing, malformed or
// unknown key is EUNAUTHENTICATED (401, with a WWW-Authenticate challenge, RFC 6750); a revoked
// key or one without the scope is EFORBIDDEN (403). The key is checked by
// access.AuthenticateAPIKey (prefix lookup, constant-time hash comparison).
func (a *API) Authenticate(scope access.Scope) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			h := c.Request().Header.Get(echo.HeaderAuthorization)
			scheme, key, ok := strings.Cut(h, " ")
			if h == "" || !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(key) == "" {
				c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="pitlane"`)
				return payments.Errorf(payments.EUNAUTHENTICATED, "send your API key as Authorization: Bearer <key>")
			}
			client, err := a.access.AuthenticateAPIKey(c.Request().Context(), strings.TrimSpace(key))
			if payments.ErrorCode(err) == payments.EUNAUTHENTICATED {
				c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="pitlane", error="invalid_token"`)
			}
			if err != nil {
				return err
			}
			if err := client.Authorize(scope); err != nil {
				c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="pitlane", error="insufficient_scope", scope="`+string(scope)+`"`)
				return err
			}
			c.Set(clientContextKey, client)
			return next(c)
		}
	}
}
