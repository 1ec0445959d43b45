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
	if !strings.ContainsFunc(s, hidden) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if hidden(r) {
			fmt.Fprintf(&b, "<U+%04X>", r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// hidden: a character of text from outside that storable writes as its code point — one that
// does not show as itself (ShownAsIs), but for the line breaks and tabs of multi-line text.
func hidden(r rune) bool { return !ShownAsIs(r) && r != '\n' && r != '\t' && r != '\r' }

// ShownAsIs reports whether r shows on a page or a terminal as what it is: a printable
// character or a space. Not a control or format character (an escape, a right-to-left override,
// a zero-width space), a line or paragraph separator, a private-use or unassigned code point.
// What a page shows from outside (a gateway's text, a contact), what the command line writes
// to an operator's terminal, and a new account's email are held to it.
func ShownAsIs(r rune) bool { return unicode.IsPrint(r) || unicode.Is(unicode.Zs, r) }
