package benchscale

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The figures come from Prometheus text exposition, parsed here in a few
// lines rather than through prometheus/common (not a direct dependency).

// sample is one line of a Prometheus text exposition.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// parseMetrics returns the samples whose metric name is in names.
func parseMetrics(r io.Reader, names ...string) ([]sample, error) {
	var out []sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		end := strings.IndexAny(line, "{ ")
		if end < 0 || !slices.Contains(names, line[:end]) {
			continue
		}
		s, err := parseSample(line, end)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

// parseSample parses `name{l="v",...} value [timestamp]`; end is where the
// name ends.
func parseSample(line string, end int) (sample, error) {
	s := sample{name: line[:end], labels: map[string]string{}}
	i := end
	if line[i] == '{' {
		i++
		for {
			for i < len(line) && (line[i] == ',' || line[i] == ' ') {
				i++
			}
			if i >= len(line) {
				return s, fmt.Errorf("unterminated labels")
			}
			if line[i] == '}' {
				i++
				break
			}
			eq := strings.IndexByte(line[i:], '=')
			if eq < 0 || i+eq+1 >= len(line) || line[i+eq+1] != '"' {
				return s, fmt.Errorf("bad label at %d", i)
			}
			key := strings.TrimSpace(line[i : i+eq])
			i += eq + 2
			var v strings.Builder
			for i < len(line) && line[i] != '"' {
				if line[i] == '\\' && i+1 < len(line) {
					if line[i+1] == 'n' {
						v.WriteByte('\n')
					} else {
						v.WriteByte(line[i+1])
					}
					i += 2
					continue
				}
				v.WriteByte(line[i])
				i++
			}
			if i >= len(line) {
				return s, fmt.Errorf("unterminated label value")
			}
			i++ // closing quote
			s.labels[key] = v.String()
		}
	}
	fields := strings.Fields(line[i:])
	if len(fields) == 0 {
		return s, fmt.Errorf("no value")
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	s.value = v
	return s, err
}

// managerMetrics is what the bench reads from the managers' /metrics,
// summed over every manager.
type managerMetrics struct {
	adds, depth, grpc float64
	addsByQueue       map[string]float64 // workqueue name → adds
	grpcByMethod      map[string]float64
}

// scrapeManagers reads every manager's /metrics.
func (b *bench) scrapeManagers(ctx context.Context) (managerMetrics, error) {
	total := managerMetrics{addsByQueue: map[string]float64{}, grpcByMethod: map[string]float64{}}
	for _, m := range b.managers() {
		body, err := b.httpGet(ctx, "https://"+m.MetricsAddr+"/metrics")
		if err != nil {
			return total, fmt.Errorf("manager %s: %w", m.Node, err)
		}
		samples, err := parseMetrics(bytes.NewReader(body),
			"workqueue_adds_total", "workqueue_depth", "strata_engineapi_calls_total")
		if err != nil {
			return total, fmt.Errorf("manager %s: %w", m.Node, err)
		}
		for _, s := range samples {
			switch s.name {
			case "workqueue_adds_total":
				total.adds += s.value
				total.addsByQueue[s.labels["name"]] += s.value
			case "workqueue_depth":
				total.depth += s.value
			case "strata_engineapi_calls_total":
				total.grpc += s.value
				total.grpcByMethod[s.labels["method"]] += s.value
			}
		}
	}
	return total, nil
}

func (b *bench) httpGet(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := b.metrics.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return body, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return body, nil
}

// writeVerbs are the verbs of apiserver_request_total that change state:
// APPLY is a server-side-apply PATCH, DELETECOLLECTION a bulk DELETE.
var writeVerbs = []string{"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"}

// reviews are POSTs that store nothing: the managers' checks of the
// bench's own scrapes of /metrics (a token and its access) are not writes
// of theirs.
var reviews = map[string]bool{"tokenreviews": true, "subjectaccessreviews": true}

// apiWrites counts API server write requests by "group/resource" ("" group
// is core), from the API server's own /metrics.
type apiWrites map[string]float64

// scrapeBoth reads the managers' and the API server's counters: every
// before/after figure of the bench is a difference of the two.
func (b *bench) scrapeBoth(ctx context.Context) (managerMetrics, apiWrites, error) {
	m, err := b.scrapeManagers(ctx)
	if err != nil {
		return m, apiWrites{}, err
	}
	a, err := b.scrapeAPIServer(ctx)
	return m, a, err
}

func (b *bench) scrapeAPIServer(ctx context.Context) (apiWrites, error) {
	body, err := b.kube.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("API server /metrics: %w", err)
	}
	samples, err := parseMetrics(bytes.NewReader(body), "apiserver_request_total")
	if err != nil {
		return nil, err
	}
	w := apiWrites{}
	for _, s := range samples {
		if slices.Contains(writeVerbs, s.labels["verb"]) && !reviews[s.labels["resource"]] {
			w[s.labels["group"]+"/"+s.labels["resource"]] += s.value
		}
	}
	return w, nil
}

// minus is w - before, keeping only what grew.
func (w apiWrites) minus(before apiWrites) apiWrites {
	d := apiWrites{}
	for k, v := range w {
		if v-before[k] > 0 {
			d[k] = v - before[k]
		}
	}
	return d
}

func diffCounts(after, before map[string]float64) map[string]float64 {
	d := map[string]float64{}
	for k, v := range after {
		if v-before[k] > 0 {
			d[k] = v - before[k]
		}
	}
	return d
}

// fmtCounts renders a breakdown as "a=3 b=1", largest first.
func fmtCounts(m map[string]float64) string {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b string) int {
		if m[a] != m[b] {
			if m[a] > m[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%g", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// drainPoll is the spacing of the scrapes that decide the managers are idle,
// and so the resolution of a drained time: well under the floor it is
// compared with (about 250 ms at 200 × 10, where a 250 ms poll alone made
// the restart look 2.4× the floor).
const drainPoll = 50 * time.Millisecond

// errNotDrained is a finding, not a setup error: managers that never go
// idle are what the bench is there to show.
var errNotDrained = errors.New("workqueues not drained")

// waitDrained polls the managers' /metrics every 250 ms until two
// consecutive scrapes both show every workqueue empty (depth 0) and the
// same adds total: nothing was queued in between. It returns the time of
// the first of those two scrapes, the earliest moment the queues were seen
// empty for good. A requeue waiting out its backoff is not in depth; if it
// fires later it simply shows up as adds in the next figure.
func (b *bench) waitDrained(ctx context.Context, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	var prev *managerMetrics
	var prevAt time.Time
	lastLog := time.Now()
	for {
		at := time.Now()
		m, err := b.scrapeManagers(ctx)
		if err != nil {
			return time.Time{}, err
		}
		if prev != nil && prev.depth == 0 && m.depth == 0 && m.adds == prev.adds {
			return prevAt, nil
		}
		prev, prevAt = &m, at
		if err := b.checkManagers(); err != nil {
			return time.Time{}, err
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("%w after %s (depth %g, adds %g)", errNotDrained, timeout, m.depth, m.adds)
		}
		if time.Since(lastLog) >= 10*time.Second {
			b.log.WithFields(logrus.Fields{"depth": m.depth, "adds": m.adds}).Info("waiting for the workqueues to drain")
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(drainPoll - time.Since(at)):
		}
	}
}

// stepQuiet measures a window in which nothing changes: once the managers
// have drained their queues, any workqueue add, API write or instance-manager
// call during -quiet is a cost of merely holding the objects.
func (b *bench) stepQuiet(ctx context.Context) error {
	if _, err := b.waitDrained(ctx, 5*time.Minute); errors.Is(err, errNotDrained) {
		b.log.WithError(err).Warn("measuring the quiet window anyway")
	} else if err != nil {
		return err
	}
	engines, err := b.strata.StrataV1beta1().Engines(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	nEngines := len(engines.Items)
	fill0 := b.diskFills()
	b.logDiskFills("before", fill0)
	nw, err := b.watchNodes(ctx)
	if err != nil {
		return err
	}
	defer nw.stop()
	m0, a0, err := b.scrapeBoth(ctx)
	if err != nil {
		return err
	}
	b.log.WithFields(logrus.Fields{"window": b.cfg.quiet, "engines": nEngines}).Info("quiet window: measuring")
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(b.cfg.quiet):
	}
	m1, a1, err := b.scrapeBoth(ctx)
	if err != nil {
		return err
	}
	nodeWrites, watchEnded := nw.finish()
	fill1 := b.diskFills()
	b.logDiskFills("after", fill1)
	if err := b.checkManagers(); err != nil {
		return err
	}

	adds := m1.adds - m0.adds
	grpc := m1.grpc - m0.grpc
	writes := a1.minus(a0)
	var strataW, leaseW, otherW float64
	other, strataBy := map[string]float64{}, map[string]float64{}
	for k, v := range writes {
		switch {
		case k == "strata.io/nodes": // reportNodeWrites
		case strings.HasPrefix(k, "strata.io/"):
			strataW += v
			strataBy[k] = v
		case k == "coordination.k8s.io/leases":
			leaseW += v
		default:
			otherW += v
			other[k] = v
		}
	}
	minutes := b.cfg.quiet.Minutes()
	perEngine := 0.0
	if nEngines > 0 {
		perEngine = grpc / float64(nEngines) / minutes
	}
	b.log.WithFields(logrus.Fields{"byQueue": fmtCounts(diffCounts(m1.addsByQueue, m0.addsByQueue))}).
		Infof("quiet window: %g workqueue adds", adds)
	b.log.WithFields(logrus.Fields{"byResource": fmtCounts(writes)}).
		Infof("quiet window: %g API writes (strata.io %g + Nodes %g, leases %g, other %g)",
			strataW+writes["strata.io/nodes"]+leaseW+otherW, strataW, writes["strata.io/nodes"], leaseW, otherW)
	b.log.WithFields(logrus.Fields{"byMethod": fmtCounts(diffCounts(m1.grpcByMethod, m0.grpcByMethod)), "engines": nEngines}).
		Infof("quiet window: %g instance-manager calls", grpc)

	w := b.cfg.quiet.String()
	b.check("workqueue adds in "+w, perMinute(adds, minutes), "0", adds == 0)
	if adds > 0 {
		b.info("  … by queue", fmtCounts(diffCounts(m1.addsByQueue, m0.addsByQueue)))
	}
	b.check("API writes, strata.io (Nodes apart), in "+w, perMinute(strataW, minutes), "0", strataW == 0)
	if strataW > 0 {
		b.info("  … by resource", fmtCounts(strataBy))
	}
	b.reportNodeWrites(w, writes["strata.io/nodes"], nodeWrites, watchEnded, freeSpaceAllowance(b.cfg.quiet))
	b.reportDiskFills(fill0, fill1)
	b.reportBackupQuiet(w, m0, m1, writes)
	b.check("API writes, other (not Leases), in "+w, perMinute(otherW, minutes), "0", otherW == 0)
	if otherW > 0 {
		b.info("  … by resource", fmtCounts(other))
	}
	b.info("API writes, Leases (heartbeats, leader election: expected), in "+w, perMinute(leaseW, minutes))
	b.check(fmt.Sprintf("gRPC calls per engine per minute (%g calls, %d engines)", grpc, nEngines),
		strconv.FormatFloat(perEngine, 'f', 3, 64), "≤ 1", perEngine <= 1)
	if grpc > 0 {
		b.info("  … by method", fmtCounts(diffCounts(m1.grpcByMethod, m0.grpcByMethod)))
	}
	return nil
}

// perMinute renders a count over the window and its rate per minute.
func perMinute(n, minutes float64) string {
	return fmt.Sprintf("%g (%.1f/min)", n, n/minutes)
}
