package web

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"pitlane/handlers"
	"pitlane/static"
	"pitlane/views"
	"pitlane/web/render"
)

// routes registers every route of the server, in one place, so that the whole URL surface
// can be read top to bottom.
func routes(e *echo.Echo, d Deps) {
	health := handlers.NewHealth(d.DB)
	e.GET("/healthz", health.Healthz)
	e.GET("/readyz", health.Readyz)

	e.GET("/static/*", echo.WrapHandler(static.Handler()))

	// Console. The home page is the shell the console issue grows from.
	e.GET("/", func(c echo.Context) error {
		return render.HTML(c, http.StatusOK, views.Home(views.Page{Title: "Console", ReplicaID: d.ReplicaID}))
	})
}
