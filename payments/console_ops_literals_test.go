package payments

import (
	"strings"
	"testing"
)

// The locks page shows a backend's statement without what its literals and comments hold, in
// every form PostgreSQL reads one (an outside review of the first version, which knew '…' only:
// an operator's psql session quoting a code in $$…$$ or E'…\'…' showed it to every role).
func TestWithoutLiteralsHidesEveryLiteralForm(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{`SELECT 'Your code is 481516' <> 'it''s'`, `SELECT '…' <> '…'`},
		{`SELECT E'buyer\'s code 481516', e'\\'`, `SELECT E'…', e'…'`},
		{`SELECT $$code 481516$$, $x$a $$ 481516$x$ || $1`, `SELECT $$…$$, $x$…$x$ || $1`},
		{"SELECT 1 -- code 481516\nFROM t /* buyer@example.com */ WHERE name$1 = some'481516'", "SELECT 1 --…\nFROM t /*…*/ WHERE name$1 = some'…'"},
		{`INSERT INTO outbox (body) VALUES ('Your code 4815`, `INSERT INTO outbox (body) VALUES ('…'`},
		{`SELECT $tag$481516`, `SELECT $tag$…$tag$`},
		{`SELECT pg_advisory_xact_lock(1001, hashtext($1))`, `SELECT pg_advisory_xact_lock(1001, hashtext($1))`},
		{`SELECT "Code 481516" FROM e`, `SELECT "Code 481516" FROM e`}, // an identifier is a name, not a value
	} {
		got := withoutLiterals(c.in)
		if got != c.want {
			t.Errorf("withoutLiterals(%q)\n = %q\nwant %q", c.in, got, c.want)
		}
		if strings.Contains(c.want, "'…'") && (strings.Contains(got, "481516") || strings.Contains(got, "buyer")) {
			t.Errorf("withoutLiterals(%q) shows a value: %q", c.in, got)
		}
	}
}
