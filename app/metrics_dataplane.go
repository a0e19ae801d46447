package app

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/strata-storage/strata/engineapi"
)

// dataPlaneScrapeTimeout bounds the call to the instance manager a scrape
// makes, well inside Prometheus' default 10 s scrape timeout.
const dataPlaneScrapeTimeout = 3 * time.Second

// dataPlaneGatherer gathers the node's instance manager's series (the
// engines' per-replica I/O latency) at scrape time over the control API's
// mTLS, so the data plane needs no listener of its own. A scrape is not a
// status path: no controller waits on it.
type dataPlaneGatherer struct {
	pool    *engineapi.Pool
	address string
}

func (g dataPlaneGatherer) Gather() ([]*dto.MetricFamily, error) {
	client, err := g.pool.Get(g.address)
	if err != nil {
		return nil, fmt.Errorf("instance manager %s: %w", g.address, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), dataPlaneScrapeTimeout)
	defer cancel()
	families, err := client.Metrics(ctx)
	if err != nil {
		return nil, fmt.Errorf("instance manager %s metrics: %w", g.address, err)
	}
	return families, nil
}

// metricsHandler serves this process's series and, when the node has an
// instance manager, its series too. An instance manager that does not
// answer costs its series and an error line in the log of the scrape, not
// the manager's own series.
func metricsHandler(pool *engineapi.Pool, imAddress string) http.Handler {
	if imAddress == "" {
		return legacyregistry.Handler()
	}
	gatherers := prometheus.Gatherers{legacyregistry.DefaultGatherer, dataPlaneGatherer{pool: pool, address: imAddress}}
	return promhttp.HandlerFor(gatherers, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}
