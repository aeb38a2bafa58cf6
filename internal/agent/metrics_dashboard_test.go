package agent

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// dashPanel is a panel of the dashboard: a graph with its queries, or a
// row, which has none and holds its panels while collapsed.
type dashPanel struct {
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"`
}

// dashQuery is a query of the dashboard and where it is.
type dashQuery struct{ where, expr string }

// dashboardQueries reads the chart's dashboard and returns its panels'
// queries, rows' included, and its variables'.
func dashboardQueries(t *testing.T) []dashQuery {
	t.Helper()
	data, err := os.ReadFile("../../charts/rdmavisor/dashboards/rdmavisor.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels     []dashPanel `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	var qs []dashQuery
	var walk func(ps []dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			if p.Type == "row" {
				if len(p.Targets) > 0 {
					t.Errorf("row %q has queries", p.Title)
				}
				walk(p.Panels)
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				qs = append(qs, dashQuery{"panel " + p.Title, tg.Expr})
			}
		}
	}
	walk(dash.Panels)
	for _, v := range dash.Templating.List {
		if v.Definition != "" {
			qs = append(qs, dashQuery{"variable", v.Definition})
		}
	}
	return qs
}

// registeredMetrics are the agent's metrics, by name, with their labels.
func registeredMetrics(t *testing.T) map[string][]string {
	t.Helper()
	ch := make(chan *prometheus.Desc, len(allDescs))
	collector{}.Describe(ch)
	close(ch)
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	labels := regexp.MustCompile(`variableLabels: \{([^{}]*)\}\}$`)
	out := map[string][]string{}
	for d := range ch {
		m, l := fqName.FindStringSubmatch(d.String()), labels.FindStringSubmatch(d.String())
		if m == nil || l == nil {
			t.Fatalf("no name or labels in %v", d)
		}
		out[m[1]] = strings.FieldsFunc(l[1], func(r rune) bool { return r == ',' })
	}
	if len(out) != len(allDescs) {
		t.Fatalf("%d names for %d descriptions", len(out), len(allDescs))
	}
	return out
}

// TestDashboardNamesRegisteredMetrics: every query of the chart's Grafana
// dashboard names metrics, and only metrics the agent registers, and
// groups them only by labels they have, so a renamed metric or label
// cannot leave a panel silently empty or merged; every metric is shown.
func TestDashboardNamesRegisteredMetrics(t *testing.T) {
	qs := dashboardQueries(t)
	if len(qs) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	registered := registeredMetrics(t)
	metric := regexp.MustCompile(`\brdmavisor_[a-z_]+\b`)
	by := regexp.MustCompile(`\bby \(([^)]*)\)`)
	used := map[string]bool{}
	for _, q := range qs {
		names := metric.FindAllString(q.expr, -1)
		if len(names) == 0 {
			t.Errorf("%s: %q names no rdmavisor metric", q.where, q.expr)
		}
		for _, n := range names {
			used[n] = true
			if _, ok := registered[n]; !ok {
				t.Errorf("%s: %q names %s, which the agent does not register", q.where, q.expr, n)
			}
		}
		// Prometheus adds instance (and job) to every series.
		for _, g := range by.FindAllStringSubmatch(q.expr, -1) {
			for _, l := range strings.Split(g[1], ",") {
				l = strings.TrimSpace(l)
				for _, n := range names {
					if ls, ok := registered[n]; ok && l != "instance" && l != "job" && !slices.Contains(ls, l) {
						t.Errorf("%s: %q groups by %s, which %s does not have (%v)", q.where, q.expr, l, n, ls)
					}
				}
			}
		}
	}
	var unused []string
	for n := range registered {
		if !used[n] {
			unused = append(unused, n)
		}
	}
	slices.Sort(unused)
	if len(unused) > 0 {
		t.Errorf("metrics no panel shows: %v", unused)
	}
}
