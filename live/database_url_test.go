package live_test

import (
	"strings"
	"testing"

	"pitlane/live"
)

// With LISTEN_DATABASE_URL unset the listener connects with DATABASE_URL, which may carry the
// pool's own settings (the README has operators raise pool_max_conns there). The listener parsed
// it as a plain connection and sent pool_max_conns to PostgreSQL, which refused every attempt:
// no replica ever listened and every console fell back to polling, silently. Outside review
// (contract).
func TestTheListenerTakesPoolSettingsInItsURL(t *testing.T) {
	t.Parallel()
	b := newBench(t, func(c *live.Config) {
		sep := "?"
		if strings.Contains(c.ConnString, "?") {
			sep = "&"
		}
		c.ConnString += sep + "pool_max_conns=8"
	})
	b.listener(t)
}
