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
		// A review of this scanner: comments nest, and a ' or $$ inside an identifier starts no literal.
		{`SELECT 1 /* outer /* inner */ customer ana@example.com code 481516 */ FROM t`, `SELECT 1 /*…*/ FROM t`},
		{`SELECT 'x' AS "buyer's", 'code 481516' AS c`, `SELECT '…' AS "buyer's", '…' AS c`},
		{`SELECT 1 AS "$$", '$$ code 481516' AS c, "a""b"`, `SELECT 1 AS "$$", '…' AS c, "a""b"`},
		{`SELECT "unclosed`, `SELECT "unclosed`},
		// One literal across quote-newline-quote, an E'…' one in escape mode to its end.
		{"SELECT E'a'\n'\\' code 481516 '", "SELECT E'…'"},
		{"SELECT E'a' -- note\n'\\' code 481516 ' AS c", "SELECT E'…' AS c"},
		{"SELECT 'a' 'b'", "SELECT '…' '…'"}, // no newline: two tokens (a syntax error), each hidden
	} {
		got := withoutLiterals(c.in)
		if got != c.want {
			t.Errorf("withoutLiterals(%q)\n = %q\nwant %q", c.in, got, c.want)
		}
		if strings.Contains(c.want, "…") && (strings.Contains(got, "481516") || strings.Contains(got, "@example")) {
			t.Errorf("withoutLiterals(%q) shows a value: %q", c.in, got)
		}
	}
}

// withoutLiterals never panics, ends, and never grows a text by more than its markers (go test
// -fuzz=FuzzWithoutLiterals ./payments/ runs it wide; the seeds run with the suite).
func FuzzWithoutLiterals(f *testing.F) {
	for _, seed := range []string{"", "'", "E'", "E'\\", "$", "$$", "$a", "$1$", "/*", "/* /*", "*/", "--", "\"", "\"\"", "U&'x'", "X'1F'", "'a''", "e'\\''"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, q string) {
		out := withoutLiterals(q)
		if len(out) > 4*len(q)+16 {
			t.Fatalf("withoutLiterals(%q) = %q: longer than its markers explain", q, out)
		}
	})
}
