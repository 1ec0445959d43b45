package gatewaysim

import (
	"bytes"
	"errors"
	"html/template"
	"net/http"

	"pitlane/payments"
)

// The hosted payment page: where confirmation_url points. It stands in for the gateway's card
// form, so it has no auth and no CSRF protection: it is a simulator's demo page.

var pageTmpl = template.Must(template.New("pay").Parse(`<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Reference gateway · {{.ID}}</title>
<style>
body{font-family:system-ui,sans-serif;max-width:28rem;margin:3rem auto;padding:0 1rem;color:#222}
.amount{font-size:2rem;margin:.5rem 0} .muted{color:#666} form{display:inline}
button{font-size:1rem;padding:.6rem 1.4rem;margin:.5rem .5rem 0 0;border:0;border-radius:.3rem;cursor:pointer}
.approve{background:#1a7f37;color:#fff} .decline{background:#cf222e;color:#fff}
</style></head>
<body>
<p class="muted">Reference gateway (simulator)</p>
<h1>Confirm payment</h1>
<p class="amount" data-testid="amount">{{.Amount}} {{.Currency}}</p>
<p class="muted">Reference <span data-testid="reference">{{.Reference}}</span> · payment <span data-testid="payment-id">{{.ID}}</span></p>
<p>Status: <strong data-testid="status">{{.Status}}</strong>{{if .DeclineCode}} ({{.DeclineCode}}){{end}}</p>
{{if .Pending}}
<form method="post" action="/pay/{{.ID}}/approve"><button class="approve" type="submit" data-testid="approve">Approve</button></form>
<form method="post" action="/pay/{{.ID}}/decline"><button class="decline" type="submit" data-testid="decline">Decline</button></form>
{{else if .ReturnURL}}
<p><a href="{{.ReturnURL}}" data-testid="return">Return to the shop</a></p>
{{end}}
</body></html>
`))

type pageData struct {
	ID, Amount, Currency, Reference, Status, DeclineCode, ReturnURL string
	Pending                                                         bool
}

func (s *Sim) pageRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /pay/{id}", s.payPage)
	mux.HandleFunc("POST /pay/{id}/approve", s.payAction(func(id string) (Payment, error) { return s.Approve(id) }))
	mux.HandleFunc("POST /pay/{id}/decline", s.payAction(func(id string) (Payment, error) { return s.Decline(id, "") }))
}

func (s *Sim) payPage(w http.ResponseWriter, r *http.Request) {
	p, ok := s.Payment(r.PathValue("id"))
	if !ok {
		http.Error(w, "no such payment", http.StatusNotFound)
		return
	}
	var buf bytes.Buffer // render first, so a template error is a clean 500
	err := pageTmpl.Execute(&buf, pageData{
		ID: p.ID, Amount: payments.FormatMinor(p.Amount, p.Currency), Currency: p.Currency, Reference: p.Reference,
		Status: p.Status, DeclineCode: p.DeclineCode, ReturnURL: p.ReturnURL, Pending: p.Status == StatusPending,
	})
	if err != nil {
		s.log.Error("gatewaysim: render the payment page", "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(buf.Bytes())
}

// payAction applies the customer's choice and sends them back to the shop. A second click
// (the payment is no longer pending) is not an error for the customer: they are sent back too,
// and the shop learns the real state from the gateway.
func (s *Sim) payAction(act func(id string) (Payment, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := act(r.PathValue("id"))
		if errors.Is(err, ErrNotFound) {
			http.Error(w, "no such payment", http.StatusNotFound)
			return
		}
		target := p.ReturnURL
		if target == "" {
			target = "/pay/" + p.ID
		}
		http.Redirect(w, r, target, http.StatusSeeOther)
	}
}
