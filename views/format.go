package views

import (
	"fmt"
	"strings"
	"time"

	"github.com/a-h/templ"

	"pitlane/access"
	"pitlane/payments"
)

// Money shows an amount in minor units as people read it: Money(1999, "EUR") = "19.99 EUR",
// Money(500, "JPY") = "500 JPY", Money(1500, "KWD") = "1.500 KWD".
func Money(amount int64, currency string) string {
	return strings.TrimSpace(payments.FormatMinor(amount, currency) + " " + currency)
}

// When shows a time in UTC to the second.
func When(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05") + " UTC"
}

// WhenPtr is When for optional times.
func WhenPtr(t *time.Time) string {
	if t == nil {
		return "—"
	}
	return When(*t)
}

// Relative says how far t is from now: "in 40s", "3m ago".
func Relative(now, t time.Time) string {
	d := t.Sub(now)
	future := d >= 0
	if !future {
		d = -d
	}
	var s string
	switch {
	case d < time.Minute:
		s = fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		s = fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		s = fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		s = fmt.Sprintf("%dd", int(d.Hours()/24))
	}
	if future {
		return "in " + s
	}
	return s + " ago"
}

// Short is the head of an id, enough to tell payments apart in a list.
func Short(id string) string { return payments.Short(id) }

// StatusClass is the CSS class of a status badge.
func StatusClass(s payments.Status) string {
	switch {
	case s == payments.StatusCompleted:
		return "badge ok"
	case s == payments.StatusFailed || s == payments.StatusCanceled:
		return "badge off"
	case s == payments.StatusUnknown:
		return "badge warn"
	default:
		return "badge"
	}
}

// PaymentURL is the console page of a payment.
func PaymentURL(id string) templ.SafeURL { return templ.SafeURL("/payments/" + id) }

// userAction is where an admin's form for user u posts (action: disable, role, password); the
// id is a number we issued.
func userAction(u access.User, action string) templ.SafeURL {
	return templ.SafeURL(fmt.Sprintf("/admin/users/%d/%s", u.ID, action))
}
