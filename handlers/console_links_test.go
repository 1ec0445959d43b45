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
