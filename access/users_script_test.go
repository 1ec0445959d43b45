package access

import (
	"testing"

	"pitlane/payments"
)

// An address's characters are, in each part (the local part whole, each label of the domain, an
// IDNA label read as the characters it spells), of one script or of those one language writes
// together (UTS #39, "highly restrictive"); ASCII digits and punctuation count for none.
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
		"สำราญ@example.co.th":         "",
		"r\u043e\u043et@example.com":  "Cyrillic and Latin",
		"ro\u03bft@example.com":       "Greek and Latin",
		"\u0458.doe@example.com":      "Cyrillic and Latin", // one local part, whatever its dots
		"r\u1040\u1040t@example.com":  "Latin and Myanmar",  // Myanmar zeros: digits count
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
	for _, email := range []string{"admi\u0307n@example.com", "adm\u0131\u0307n@example.com", "jo\u0237\u0307e@example.com"} {
		if err := ValidateEmail(email); payments.ErrorCode(err) != payments.EINVALID {
			t.Errorf("ValidateEmail(%q), a dot above an i or j: %v, want invalid", email, err)
		}
	}
}

// The skeleton of an address (UTS #39) against the others': the look-alikes of one address
// whatever the trick — another script, a styled letter, another script's zero, another
// apostrophe or hyphen, a whole address in another script.
func TestEmailLookalike(t *testing.T) {
	emails := []string{"root@example.com", "o'brien@example.com", "jean-luc@example.com", "ops@pay.io", "zoe@example.de",
		"dorn@corp.example", "lee@corp.example", "ivan@пример.рф"}
	for email, want := range map[string]string{
		"r\u043e\u043et@example.com":                         "root@example.com",
		"r\U0001D5C8\U0001D5C8t@example.com":                 "root@example.com",
		"root@\u212Fxample.com":                              "root@example.com",
		"r\u1040\u1040t@example.com":                         "root@example.com",
		"o\u2019brien@example.com":                           "o'brien@example.com",
		"jean\u2010luc@example.com":                          "jean-luc@example.com",
		"\u043e\u0440\u0455@\u0440\u0430\u0443.\u0456\u043e": "ops@pay.io",
		"\u04cf\u0435\u0435@corp.example":                    "lee@corp.example", // a small palochka and Cyrillic e's
		"ivan@xn--e1afmkfd.xn--p1ai":                         "ivan@пример.рф",   // the same mailbox
		"dom@corp.example":                                   "",                 // two ASCII addresses: two people
		"root@example.com":                                   "",                 // itself: the unique email says so
		"zoë@example.de":                                     "",
		"ana@example.com":                                    "",
	} {
		if got := emailLookalike(email, emails); got != want {
			t.Errorf("emailLookalike(%q) = %q, want %q", email, got, want)
		}
	}
}
