package payments

import "testing"

// A character that shows as nothing beside a Latin letter must not reach a staff page in clear:
// "succ\uFE00eeded" reads as succeeded exactly as "succ\u200Ceeded" did.
func TestStorableEscapesAVariationSelectorThatVariesNothing(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"succ\uFE00eeded",      // VS1 after a Latin letter
		"succ\uFE0Feeded",      // VS16 after a Latin letter
		"succ\U000E0100eeded",  // VS17 (ideographic variation selector)
		"succ\u180Beeded",      // Mongolian free variation selector
		"amount 100\uFE0E EUR", // VS15 after a digit: shows as "100"
	} {
		if got := storable(s); got == s {
			t.Errorf("storable(%+q) kept an invisible selector in clear: %q", s, got)
		}
	}
}

func TestAContactWithAVariationSelectorIsRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []string{"ali\uFE00ce@example.com", "ali\U000E0100ce@example.com", "ali\u180Bce@example.com"} {
		if err := ValidateContact(c); err == nil {
			t.Errorf("ValidateContact(%+q) accepted a contact that shows as alice@example.com", c)
		}
	}
}

// A contact is an address: a joiner or selector in it is refused even where Escape lets one
// through on a page, since in context it may still show as nothing — a selector no emoji has
// after 😀, a joiner between emoji that form no sequence or between Arabic letters that join
// anyway — and the contact would show as another address than the one codes go to (a review of
// 79f8ac5, which took contacts by Escape's rule and was reverted). ❤️ in a contact is refused.
func TestAContactThatShowsAsAnotherAddressIsRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ spoof, looksLike string }{
		{"alice\U0001F600\uFE00@example.com", "alice\U0001F600@example.com"},
		{"alice\U0001F600\u200D\U0001F600@example.com", "alice\U0001F600\U0001F600@example.com"},
		{"\u0628\u200D\u0628@example.com", "\u0628\u0628@example.com"},
		{"\u2764\uFE0F@example.com", "\u2764@example.com"},
	} {
		if err := ValidateContact(c.looksLike); err != nil {
			t.Fatalf("%+q refused: %v", c.looksLike, err)
		}
		if err := ValidateContact(c.spoof); err == nil {
			t.Errorf("ValidateContact(%+q) accepted: it shows as %+q, another address", c.spoof, c.looksLike)
		}
	}
}

// Emoji ZWJ sequences a customer or gateway types must show as themselves.
func TestEmojiSequencesAreKept(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"🙂\u200D↔\uFE0F", // head shaking horizontally (Emoji 15.1): U+2194 is Sm, not So
		"❤\uFE0F", "👩\u200D💻", "👍🏽", "1\uFE0F\u20E3", "‼\uFE0F", "葛\U000E0100",
	} {
		if got := storable(s); got != s {
			t.Errorf("storable(%+q) = %q", s, got)
		}
	}
}

// A non-joiner after an Arabic letter with a vowel mark (harakat are script Inherited).
func TestArabicWithItsVowelMarksAndANonJoinerIsKept(t *testing.T) {
	t.Parallel()
	s := "مِ\u200Cی" // mim kasra ZWNJ yeh
	if got := storable(s); got != s {
		t.Errorf("storable(%+q) = %q", s, got)
	}
}

// Emoji a customer types with U+FE0F whose base is not a symbol in Go's tables
// (emoji-variation-sequences.txt: U+2139 is Ll, U+3030 Pd, U+303D Po) show as typed, as ❤️ does
// (a review of dc3a58e).
func TestEmojiWithANonSymbolBaseAreKept(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"ℹ\uFE0F", "〰\uFE0F", "〽\uFE0F"} {
		if got := storable(s); got != s {
			t.Errorf("storable(%+q) = %q", s, got)
		}
	}
}

// A selector or joiner after an ASCII symbol varies nothing (no emoji or standardized variation
// sequence has $ + < = > ^ ` | ~ as its base) and shows as nothing, as "100\uFE0E EUR" did: it
// does not reach a staff page in clear (a review of dc3a58e).
func TestASelectorOrJoinerAfterAnASCIISymbolIsEscaped(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"$\uFE0E100",       // reads "$100"
		"amount=\uFE0F100", // reads "amount=100"
		"ref=ab|\uFE00cd",  // reads "ref=ab|cd"
		"a+\u200D=b",       // ZWJ between two ASCII math symbols
	} {
		if got := storable(s); got == s {
			t.Errorf("storable(%+q) kept an invisible character in clear: %q", s, got)
		}
	}
}

// A selector or joiner after a non-ASCII symbol that is no emoji's base (a currency sign, a math
// operator) shows as nothing next to an amount, as "$\uFE0E100" did: escaped (a review).
func TestASelectorAfterACurrencySignIsEscaped(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"€\uFE0E100",          // reads "€100"
		"refunded £\uFE0F100", // reads "£100"
		"¥\uFE00100",          // reads "¥100"
		"100\u00A0€\u200D£",   // ZWJ between two currency signs
		"amount≠\uFE0F100",    // reads "amount≠100"
		"20°\uFE0E C",
	} {
		if got := storable(s); got == s {
			t.Errorf("storable(%+q) kept an invisible character in clear: %q", s, got)
		}
	}
}

// Everyday emoji and words with their selectors and joiners stay as typed.
func TestEverydayTextIsKept(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"👨\u200D👩\u200D👧\u200D👦", "👩🏽\u200D💻", "🏃🏻\u200D♀\uFE0F", "🏳\uFE0F\u200D🌈", "🏳\uFE0F\u200D⚧\uFE0F", "🏴\u200D☠\uFE0F",
		"👩\u200D❤\uFE0F\u200D💋\u200D👨", "❤\uFE0F\u200D🔥", "👁\uFE0F\u200D🗨\uFE0F", "🇫🇷🇯🇵", "#\uFE0F\u20E3 1\uFE0F\u20E3 *\uFE0F\u20E3",
		"©\uFE0F ®\uFE0F ™\uFE0F ↔\uFE0F ▶\uFE0F ☺\uFE0F ⤴\uFE0F Ⓜ\uFE0F ㊗\uFE0F ‼\uFE0F ⁉\uFE0F ℹ\uFE0F",
		"क्\u200Dष", "श्\u200Cर", "می\u200Cخواهم", "کتاب\u200Cها", "ශ්\u200Dරී", "日本語の文章です", "葛\U000E0100城",
		"👋🏿 hi", "🧑\u200D🤝\u200D🧑",
	} {
		if got := storable(s); got != s {
			t.Errorf("storable(%+q) = %+q", s, got)
		}
	}
}
