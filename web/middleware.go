package web

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
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
			log.LogAttrs(context.Background(), level, "http request",
				slog.String("method", v.Method),
				slog.String("uri", v.URI),
				slog.Int("status", v.Status),
				slog.Duration("latency", v.Latency),
				slog.Int64("bytes", v.ResponseSize),
				slog.String("remote_ip", v.RemoteIP),
				slog.String("request_id", v.RequestID),
			)
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
