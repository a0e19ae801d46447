package deployed

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

// scrape reads a manager's /metrics, as Prometheus does.
func scrape(t *testing.T, node string) map[string]*dto.MetricFamily {
	t.Helper()
	port := env.chart.Values["ports"].(map[string]any)["metrics"]
	client, err := env.cluster.ManagerMetricsClient(context.Background(), ns)
	require.NoError(t, err)
	resp, err := client.Get(fmt.Sprintf("https://%s:%v/metrics", node, port))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return families
}

// sumOver adds the values of family's series whose labels include want,
// over every manager's scrape.
func sumOver(scrapes []map[string]*dto.MetricFamily, family string, want map[string]string) (float64, int) {
	total, series := 0.0, 0
	for _, s := range scrapes {
		f := s[family]
		if f == nil {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue next
				}
			}
			series++
			switch {
			case m.GetCounter() != nil:
				total += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				total += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				total += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return total, series
}
