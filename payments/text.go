package payments

import (
	"fmt"
	"strings"
	"unicode"
)

// storable is s as a text column takes it: PostgreSQL refuses a NUL byte and invalid UTF-8 in
// text, and the whole statement with it. Text that others choose reaches our rows — an HTTP
// client's error quoting a TLS certificate's names (a receiver at EVENTS_WEBHOOK_URL or
// NOTIFY_WEBHOOK_URL picks them), a gateway's error code — and a failure whose record was
// refused was never counted: no backoff, no alert, the row leased until its lease ran out (an
// outside review, events webhook). A NUL is written as the two characters \0. A character that
// shows as nothing or as something else (ShownAsIs: a right-to-left override, a zero-width
// space, an escape) is written as its code point, <U+202E>: this text is read by staff on the
// payment's page and in finance cases, and an override turned the rest of it around — "says
// (succeeded, 100 EUR)" read as another status or amount than it was (an outside review,
// console).
func storable(s string) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", `\0`)
	return Escape(s, func(r rune) bool { return r == '\n' || r == '\t' || r == '\r' },
		func(r rune) string { return fmt.Sprintf("<U+%04X>", r) })
}

// Escape is s with each character that does not show as itself (ShownAsIs) written as esc
// writes it, but for those keep lets through (nil: none) and a joiner or a variation selector
// where it does what it is typed for (fits): 👩‍💻 was written with <U+200D> in it, ❤️ with
// <U+FE0F>, a Persian word with <U+200C> (reviews).
func Escape(s string, keep func(rune) bool, esc func(rune) string) string {
	hides := func(r rune) bool { return !ShownAsIs(r) && (keep == nil || !keep(r)) }
	if !strings.ContainsFunc(s, hides) {
		return s
	}
	rs := []rune(s)
	var b strings.Builder
	escaped := false // the previous character was written escaped
	for i, r := range rs {
		prev, next := rune(-1), rune(-1) // none; prev too when it was escaped (no base for what follows)
		if i > 0 && !escaped {
			prev = rs[i-1]
		}
		if i+1 < len(rs) {
			next = rs[i+1]
		}
		if escaped = hides(r) && !fits(prev, r, next); escaped {
			b.WriteString(esc(r))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// fits reports whether r, a joiner or a variation selector between prev and next (-1: none),
// does what it is typed for (prev is -1 when it was itself escaped). A zero-width joiner
// between an emoji's parts (emojiBase: a symbol, a skin tone; or the emoji selector, then a
// symbol); a zero-width joiner or non-joiner between letters (or a letter's marks) of a script
// whose letters join or form conjuncts — Arabic, Persian, Syriac, N'Ko, Mongolian, the Indic
// scripts; a variation selector after a base it varies — the
// text or emoji selector after an emoji's base or a keycap's digit, an ideographic one after a
// Han ideograph, a Mongolian one after a Mongolian letter. Anywhere else it shows as nothing:
// "ro\u200Dot" read as root, "succ\u200Ceeded" and "succ\uFE00eeded" as succeeded, "100\uFE0E"
// as 100 (reviews).
func fits(prev, r, next rune) bool {
	switch {
	case r == '\u200D' && (emojiBase(prev) || prev == '\uFE0F') && emojiBase(next):
		return true
	case r == '\u200D' || r == '\u200C':
		return (joining(prev) || unicode.Is(unicode.M, prev) && unicode.Is(unicode.Inherited, prev) && !unicode.Is(unicode.Variation_Selector, prev)) &&
			joining(next)
	case r == '\uFE0E' || r == '\uFE0F':
		return emojiBase(prev) || (prev >= '0' && prev <= '9' || prev == '#' || prev == '*') && next == '\u20E3'
	case r >= '\uFE00' && r <= '\uFE0D':
		return emojiBase(prev) || unicode.Is(unicode.Han, prev)
	case r >= 0xE0100 && r <= 0xE01EF:
		return unicode.Is(unicode.Han, prev)
	case r >= '\u180B' && r <= '\u180D', r == '\u180F':
		return unicode.Is(unicode.L, prev) && unicode.Is(unicode.Mongolian, prev)
	}
	return false
}

// emojiBase: a character an emoji's selector or joiner may follow or precede — a pictograph
// (a symbol of category So beyond Latin-1, © or ®), a skin tone, or one of the emoji Unicode
// files elsewhere: arrows and squares among the math symbols (↔ ↕ ◻ ◼ ◽ ◾ ⤴ ⤵) and ‼ ⁉ ℹ 〰 〽.
// Not an ASCII symbol, a currency sign, ° or a math operator, after which a selector varies
// nothing and shows as nothing: "$\uFE0E100" and "€\uFE0E100" read as $100 and €100 (reviews).
func emojiBase(r rune) bool {
	switch {
	case r == '©', r == '®', r == '‼', r == '⁉', r == 'ℹ', r == '〰', r == '〽',
		r == '↔', r == '↕', r >= '◻' && r <= '◾', r == '⤴', r == '⤵',
		r >= 0x1F3FB && r <= 0x1F3FF: // skin tones (Sk)
		return true
	}
	return r > 0xFF && unicode.Is(unicode.So, r)
}

// joining: a letter or mark of a script whose letters join or form conjuncts.
func joining(r rune) bool {
	return unicode.In(r, unicode.L, unicode.M) && unicode.In(r, unicode.Arabic, unicode.Syriac, unicode.Nko, unicode.Mongolian,
		unicode.Devanagari, unicode.Bengali, unicode.Gurmukhi, unicode.Gujarati, unicode.Oriya, unicode.Tamil, unicode.Telugu,
		unicode.Kannada, unicode.Malayalam, unicode.Sinhala)
}

// ShownAsIs reports whether r shows on a page or a terminal as what it is. Not a control or
// format character (an escape, a right-to-left override, a zero-width space), a line or
// paragraph separator, a private-use character or a noncharacter, and not a character Unicode
// says a renderer shows as nothing (Other_Default_Ignorable: a combining grapheme joiner, a
// Hangul filler) — "ro\u034Fot@example.com" was a new admin that looked like root (a review).
// Nor a variation selector, which shows as nothing after a letter or a digit ("succ\uFE00eeded",
// "100\uFE0E": a review); Escape lets one through after a base it varies (❤️). A code point
// Go's Unicode tables do not know yet (a newer emoji, a newer CJK ideograph) is shown as itself:
// escaped, an operator's terminal showed \u1fae9 for an emoji the customer wrote (a review). What a page shows from outside (a gateway's text, a contact),
// what the command line writes to an operator's terminal, and a new account's email are held
// to it.
func ShownAsIs(r rune) bool {
	return !unicode.IsControl(r) && !unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp, unicode.Co, unicode.Cs,
		unicode.Noncharacter_Code_Point, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector)
}
