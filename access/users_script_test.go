package access

import (
	"testing"

	"pitlane/payments"
)

// An address's letters are, in each part (the local part, each label of the domain, an IDNA label
// read as the letters it spells), of one script or of those one language writes together (UTS
// #39, "highly restrictive"); digits and punctuation count for none.
func TestMixedScripts(t *testing.T) {
	for email, want := range map[string]string{
		"root@example.com":            "",
		"zoë.müller@example.de":       "",
		"山田たろう@example.jp":            "",
		"김철수@example.kr":              "",
		"иван@пример.рф":              "",
		"иван@xn--e1afmkfd.xn--p1ai":  "", // the same, its domain in punycode
		"ivan@пример.рф":              "",
		"иван@example.com":            "",
		"r\u043e\u043et@example.com":  "Cyrillic and Latin",
		"ro\u03bft@example.com":       "Greek and Latin",
		"root@ex\u0430mple.com":       "Cyrillic and Latin",
		"root@xn--exmple-4nf.com":     "Cyrillic and Latin", // the same, in punycode
		"root@XN--EXMPLE-4NF.com":     "Cyrillic and Latin",
		"山田@пример.рф":                "",
		"山田и@example.jp":              "Cyrillic and Han",
		"root@xn--not-punycode-!.com": "",
	} {
		if got := mixedScripts(email); got != want {
			t.Errorf("mixedScripts(%q) = %q, want %q", email, got, want)
		}
	}
}

// A compatibility form of a letter (a styled, full-width or script letter: NFKC folds it) is no
// script's, so mixedScripts cannot see it: ValidateEmail refuses any address NFKC changes (a
// review: "r𝗈𝗈t@example.com" was a second admin that looked like root).
func TestValidateEmailRefusesCompatibilityForms(t *testing.T) {
	for _, email := range []string{"r\U0001D5C8\U0001D5C8t@example.com", "root@\u212Fxample.com", "\uFF52oot@example.com", "root@example.co\u2098"} {
		if err := ValidateEmail(email); payments.ErrorCode(err) != payments.EINVALID {
			t.Errorf("ValidateEmail(%q) = %v, want invalid", email, err)
		}
	}
	for _, email := range []string{"root@example.com", "zoë@example.de", "山田@example.jp", "иван@пример.рф"} {
		if err := ValidateEmail(email); err != nil {
			t.Errorf("ValidateEmail(%q) = %v", email, err)
		}
	}
}
