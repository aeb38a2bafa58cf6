package agent

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestDashboardNamesRegisteredMetrics: every query of the chart's Grafana
// dashboard names metrics, and only metrics the agent registers, so a
// renamed metric cannot leave a panel silently empty.
func TestDashboardNamesRegisteredMetrics(t *testing.T) {
	data, err := os.ReadFile("../../charts/rdmavisor/dashboards/rdmavisor.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	registered := map[string]bool{}
	ch := make(chan *prometheus.Desc, len(allDescs))
	collector{}.Describe(ch)
	close(ch)
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range ch {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("no name in %v", d)
		}
		registered[m[1]] = true
	}
	if len(registered) != len(allDescs) {
		t.Fatalf("%d names for %d descriptions", len(registered), len(allDescs))
	}
	metric := regexp.MustCompile(`\brdmavisor_[a-z_]+\b`)
	used := map[string]bool{}
	exprs := 0
	check := func(where, expr string) {
		names := metric.FindAllString(expr, -1)
		if len(names) == 0 {
			t.Errorf("%s: %q names no rdmavisor metric", where, expr)
		}
		for _, n := range names {
			used[n] = true
			if !registered[n] {
				t.Errorf("%s: %q names %s, which the agent does not register", where, expr, n)
			}
		}
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs++
			check("panel "+p.Title, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		if v.Definition != "" {
			check("variable", v.Definition)
		}
	}
	if exprs == 0 {
		t.Fatal("the dashboard has no queries")
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
