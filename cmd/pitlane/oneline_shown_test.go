package main

import "testing"

// Text that shows as itself reaches the operator's terminal as itself: a code point Go's tables
// (Unicode 15.0) call unassigned — an emoji of Unicode 16, a CJK ideograph of Extension I — was
// escaped as "\u1fae9" once one predicate decided it (a review); an emoji's zero-width joiner
// and a Persian word's non-joiner were escaped too. A joiner anywhere else (inside a Latin word
// or a number, beside a space), and what turns a line around, still are.
func TestOneLineKeepsTextThatShowsAsItself(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"Zoë Łukasz 李小龍 😀",    // held before too
		"customer wrote 🫩 ok", // U+1FAE9 FACE WITH BAGS UNDER EYES (Unicode 16.0)
		"name 𮯰 ok",           // U+2EBF0, CJK Unified Ideographs Extension I (Unicode 15.1)
	} {
		if got := oneLine(s); got != s {
			t.Errorf("oneLine(%q) = %q, want it unchanged", s, got)
		}
	}
	for _, s := range []string{"dev 👩\u200d💻 ok", "می\u200cخواهم"} {
		if got := oneLine(s); got != s {
			t.Errorf("oneLine(%q) = %q, want it unchanged", s, got)
		}
	}
	for s, want := range map[string]string{
		"a \u200d b":      `a \u200d b`,
		"\u200dlead":      `\u200dlead`,
		"ok \u202edeliaf": `ok \u202edeliaf`,
		"x\u200d\u202ey":  `x\u200d\u202ey`,
	} {
		if got := oneLine(s); got != want {
			t.Errorf("oneLine(%q) = %q, want %q", s, got, want)
		}
	}
}

// "ro\uFE00ot" reads as root on the operator's terminal exactly as "ro\u200Dot" did.
func TestOneLineEscapesAVariationSelectorThatVariesNothing(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"ro\uFE00ot", "ro\U000E0100ot", "ro\u180Bot"} {
		if got := oneLine(s); got == s {
			t.Errorf("oneLine(%+q) kept it in clear: %q", s, got)
		}
	}
}

// On the operator's terminal a selector after an ASCII symbol, and a joiner after an escaped
// selector, show as nothing: escaped (a review of dc3a58e).
func TestOneLineEscapesASelectorAfterAnASCIISymbol(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"refunded $\uFE0E100", "status=\uFE0Fsucceeded", "a\uFE0F\u200D$"} {
		if got := oneLine(s); got == s || got == "a\\ufe0f\u200D$" {
			t.Errorf("oneLine(%+q) = %+q: an invisible character in clear", s, got)
		}
	}
}

// On the terminal too, a selector after a currency sign is escaped (a review).
func TestOneLineEscapesASelectorAfterACurrencySign(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"refunded €\uFE0E100", "amount=£\uFE0F100 status=succeeded"} {
		if got := oneLine(s); got == s {
			t.Errorf("oneLine(%+q) = %+q: an invisible character in clear", s, got)
		}
	}
}
