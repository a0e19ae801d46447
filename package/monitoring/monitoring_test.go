// Package monitoring holds the Prometheus scrape job and the Grafana
// dashboard for Strata's managers; its test holds them to the metrics the
// managers serve.
package monitoring

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/strata-storage/strata/controller"
	"github.com/strata-storage/strata/controller/backup"
	"github.com/strata-storage/strata/engine/replication"
	"github.com/strata-storage/strata/engineapi"
)

// servedMetrics are the names of the series a manager serves (client-go's
// workqueue series aside).
func servedMetrics(t *testing.T) map[string]bool {
	collectors := append(engineapi.Collectors(), controller.NewMetricsCollector(nil, ""),
		backup.BackupDuration, backup.BackupUploadedBytes, backup.BackupFailures,
		replication.ReplicaIODuration) // gathered from the instance manager (app/metrics_dataplane.go)
	names := map[string]bool{}
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for _, c := range collectors {
		ch := make(chan *prometheus.Desc, 64)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			require.NotNil(t, m, d.String())
			names[m[1]] = true
		}
	}
	return names
}

// Every series the dashboard queries is one the managers serve.
func TestDashboardQueriesServedMetrics(t *testing.T) {
	raw, err := os.ReadFile("grafana-dashboard.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	served := servedMetrics(t)
	metric := regexp.MustCompile(`\b(strata_[a-z_]+|workqueue_[a-z_]+)`)
	used := 0
	for _, p := range dash.Panels {
		require.NotEmpty(t, p.Targets, p.Title)
		for _, target := range p.Targets {
			for _, name := range metric.FindAllString(target.Expr, -1) {
				used++
				if strings.HasPrefix(name, "workqueue_") {
					continue // client-go's, registered by its import
				}
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_count"), "_sum")
				assert.True(t, served[base], "panel %q queries %s, which no manager serves", p.Title, name)
			}
		}
	}
	assert.Positive(t, used)
}

// The scrape job keeps the managers' metrics port, named as the chart names it.
func TestScrapeJob(t *testing.T) {
	raw, err := os.ReadFile("prometheus-scrape.yaml")
	require.NoError(t, err)
	var jobs []map[string]any
	require.NoError(t, yaml.Unmarshal(raw, &jobs))
	require.Len(t, jobs, 1)
	assert.Equal(t, "strata-manager", jobs[0]["job_name"])
	chart, err := os.ReadFile("../chart/strata/templates/manager.yaml")
	require.NoError(t, err)
	assert.Contains(t, string(chart), "{name: metrics, containerPort:", "the port the job keeps")
	assert.Contains(t, string(raw), "regex: metrics")
}
