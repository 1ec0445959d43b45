package handlers

import (
	"errors"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
)

const clientContextKey = "pitlane.api_client"

// ClientFrom returns the API client the request was authenticated as (zero outside /api/v1).
func ClientFrom(c echo.Context) payments.APIClient {
	cl, _ := c.Get(clientContextKey).(payments.APIClient)
	return cl
}

// Authenticate is the bearer-key middleware of /api/v1: a missing, malformed or unknown key is
// 401 with a WWW-Authenticate challenge (RFC 6750); a revoked client's key is 403. The key is
// checked by payments.AuthenticateAPIKey (prefix lookup, constant-time hash comparison).
func (a *API) Authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if err := a.ready(); err != nil {
			return err
		}
		h := c.Request().Header.Get(echo.HeaderAuthorization)
		scheme, key, ok := strings.Cut(h, " ")
		if h == "" || !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(key) == "" {
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="pitlane"`)
			return echo.NewHTTPError(http.StatusUnauthorized, "send your API key as Authorization: Bearer <key>")
		}
		client, err := a.svc.AuthenticateAPIKey(c.Request().Context(), strings.TrimSpace(key))
		switch {
		case errors.Is(err, payments.ErrUnauthenticated):
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="pitlane", error="invalid_token"`)
			return echo.NewHTTPError(http.StatusUnauthorized, "the API key is not valid")
		case errors.Is(err, payments.ErrRevoked):
			return echo.NewHTTPError(http.StatusForbidden, "the API key was revoked")
		case err != nil:
			return err
		}
		c.Set(clientContextKey, client)
		return next(c)
	}
}
