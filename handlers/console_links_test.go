package handlers_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"

	"pitlane/access"
)

// Every link the console shows a signed-in user opens for that user's role: crawled from the
// dashboard through the real router, as support, finance and admin, following redirects. An
// outside review found the dashboard's "Open cases" card linking support to a page that
// answers them 403. Negative control: the card as a link for every role fails for support.
func TestEveryConsoleLinkOpensForItsRole(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.opsDay(t)
	roles := map[string]access.Role{"sup@example.com": access.RoleSupport, "fin@example.com": access.RoleFinance,
		"adm@example.com": access.RoleAdmin}
	for email, role := range roles {
		b.user(t, email, role)
	}
	for email, role := range roles {
		a := b.agent(t)
		a.login(email)
		seen := map[string]bool{}
		from := map[string]string{}
		queue := []string{"/"}
		for len(queue) > 0 && len(seen) < 200 {
			p := queue[0]
			queue = queue[1:]
			if seen[p] {
				continue
			}
			seen[p] = true
			rec := a.get(p)
			for rec.Code == http.StatusSeeOther || rec.Code == http.StatusFound {
				loc := rec.Header().Get("Location")
				if strings.HasPrefix(loc, "/login") {
					break
				}
				rec = a.get(loc)
			}
			if rec.Code >= 400 {
				t.Errorf("%s (%s): GET %s -> %d (linked from %s)", email, role, p, rec.Code, from[p])
				continue
			}
			if !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") {
				continue
			}
			doc, err := goquery.NewDocumentFromReader(strings.NewReader(rec.Body.String()))
			if err != nil {
				t.Fatal(err)
			}
			doc.Find("a[href]").Each(func(_ int, s *goquery.Selection) {
				href, _ := s.Attr("href")
				u, err := url.Parse(href)
				if err != nil || u.Host != "" || u.Path == "" || strings.HasPrefix(u.Path, "/static/") {
					return
				}
				if !strings.HasPrefix(u.Path, "/") {
					return
				}
				target := u.Path
				if u.RawQuery != "" {
					target += "?" + u.RawQuery
				}
				if !seen[target] {
					if _, ok := from[target]; !ok {
						from[target] = p
					}
					queue = append(queue, target)
				}
			})
		}
	}
}

// TestConsoleNavMarksTheCurrentPage: the console's navigation and the finance tabs showed the
// current page by its look alone (class "active": a lighter background). What the look says is
// in the markup too (WCAG 1.3.1): aria-current="page" on that entry and on no other, so a screen
// reader says "current page" (an outside review). Negative control: without currentIf on the
// nav's links (views/layout.templ) or the tabs' (views/finance.templ) it fails.
func TestConsoleNavMarksTheCurrentPage(t *testing.T) {
	t.Parallel()
	b, _, _, _ := stuckBench(t)
	fin := b.agent(t)
	fin.login("fin@example.com")
	for _, p := range []struct{ path, nav, tab string }{
		{"/finance/cases", "Finance", "Cases"},
		{"/finance/stuck", "Finance", "Stuck money"},
		{"/payments", "Payments", ""},
	} {
		doc := page(t, fin.get(p.path), http.StatusOK)
		for _, w := range []struct{ sel, want string }{{`[data-testid="nav"]`, p.nav}, {`[data-testid="finance-tabs"]`, p.tab}} {
			var active, current []string
			doc.Find(w.sel + " a.active").Each(func(_ int, a *goquery.Selection) { active = append(active, strings.TrimSpace(a.Text())) })
			doc.Find(w.sel + ` a[aria-current="page"]`).Each(func(_ int, a *goquery.Selection) { current = append(current, strings.TrimSpace(a.Text())) })
			want := []string{w.want}
			if w.want == "" {
				want = nil
			}
			if strings.Join(active, "|") != strings.Join(want, "|") || strings.Join(current, "|") != strings.Join(want, "|") {
				t.Errorf("%s %s: shown as current %q, aria-current=\"page\" on %q; want both %q", p.path, w.sel, active, current, want)
			}
		}
	}
}
