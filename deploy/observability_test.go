package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const (
	alertsPath    = "observability/alerts.yaml"
	dashboardPath = "observability/grafana-dashboard.json"
	metricsDoc    = "../docs/observability.md"
)

// metricName finds Tether metric names in PromQL.
var metricName = regexp.MustCompile(`\btether_[a-z_]+`)

// seriesBase maps a histogram's series (_bucket, _sum, _count) to the
// histogram's documented name.
func seriesBase(name string, documented []string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && slices.Contains(documented, base) {
			return base
		}
	}
	return name
}

// documentedMetrics are the metric names of the table rows of
// docs/observability.md ("| `tether_…` | …").
func documentedMetrics(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile(metricsDoc)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(string(doc), "\n") {
		if rest, ok := strings.CutPrefix(line, "| `"); ok && strings.HasPrefix(rest, "tether_") {
			names = append(names, metricName.FindString(rest))
		}
	}
	if len(names) == 0 {
		t.Fatalf("%s lists no metric", metricsDoc)
	}
	return names
}

// TestAlertRulesPassPromtool runs `promtool check rules` (Debian's
// prometheus package) on the alert rules.
func TestAlertRulesPassPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("TETHER_REQUIRE_PROMTOOL") == "1" {
			t.Fatal("promtool is not installed and TETHER_REQUIRE_PROMTOOL=1 (apt-get install prometheus)")
		}
		// By design: without promtool the rules cannot be checked by Prometheus;
		// CI installs it and sets TETHER_REQUIRE_PROMTOOL=1, so there it fails instead.
		t.Skip("promtool is not installed (apt-get install prometheus): the alert rules were not checked by Prometheus itself")
	}
	out, err := exec.Command(promtool, "check", "rules", alertsPath).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules %s: %v\n%s", alertsPath, err, out)
	}
}

// TestAlertsAndDashboardUseDocumentedMetrics parses the rules and the
// Grafana dashboard and checks that every Tether metric they query is one
// the server exports (docs/observability.md lists them; the control plane's
// metrics test checks the list against a real scrape).
func TestAlertsAndDashboardUseDocumentedMetrics(t *testing.T) {
	documented := documentedMetrics(t)
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert  string            `yaml:"alert"`
				Expr   string            `yaml:"expr"`
				Labels map[string]string `yaml:"labels"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	raw, err := os.ReadFile(alertsPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatalf("%s: %v", alertsPath, err)
	}
	exprs := map[string]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" {
				t.Fatalf("%s: rule %q in %s needs an alert name, an expr and a severity", alertsPath, r.Alert, g.Name)
			}
			exprs["alert "+r.Alert] = r.Expr
		}
	}
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	raw, err = os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	if dash.UID == "" {
		t.Fatalf("%s has no uid", dashboardPath)
	}
	for _, p := range dash.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Fatalf("%s: panel %q queries nothing", dashboardPath, p.Title)
		}
		for i, target := range p.Targets {
			exprs["panel "+p.Title+" #"+string(rune('A'+i))] = target.Expr
		}
	}
	used := map[string]bool{}
	for where, expr := range exprs {
		names := metricName.FindAllString(expr, -1)
		if len(names) == 0 {
			t.Fatalf("%s queries no Tether metric: %s", where, expr)
		}
		for _, n := range names {
			base := seriesBase(n, documented)
			if !slices.Contains(documented, base) {
				t.Fatalf("%s queries %s, which %s does not list", where, n, filepath.Base(metricsDoc))
			}
			used[base] = true
		}
	}
	// Every documented domain metric is on the dashboard.
	for _, n := range documented {
		if !used[n] {
			t.Errorf("%s is documented but neither on the dashboard nor in an alert", n)
		}
	}
}
