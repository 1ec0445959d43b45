package access

import "testing"

// An address's letters are of one script, or of those one language writes together (UTS #39,
// "highly restrictive"); digits and punctuation count for none.
func TestMixedScripts(t *testing.T) {
	for email, want := range map[string]string{
		"root@example.com":           "",
		"zoë.müller@example.de":      "",
		"山田たろう@example.jp":           "",
		"김철수@example.kr":             "",
		"иван@пример.рф":             "",
		"r\u043e\u043et@example.com": "Cyrillic and Latin",
		"ro\u03bft@example.com":      "Greek and Latin",
		"иван@example.com":           "Cyrillic and Latin",
		"山田@пример.рф":               "Cyrillic and Han",
	} {
		if got := mixedScripts(email); got != want {
			t.Errorf("mixedScripts(%q) = %q, want %q", email, got, want)
		}
	}
}
