package benchscale

import (
	"strings"
	"testing"
	"time"
)

func TestParseMetrics(t *testing.T) {
	text := `# HELP workqueue_adds_total Total number of adds handled by workqueue
# TYPE workqueue_adds_total counter
workqueue_adds_total{name="strata-node"} 12
workqueue_adds_total{name="strata-volume"} 3e+03
workqueue_depth{name="strata-node"} 0
workqueue_depth_other 5
apiserver_request_total{code="201",group="strata.io",resource="volumes",verb="POST",odd="a\"b,c}"} 7 1700000000
`
	samples, err := parseMetrics(strings.NewReader(text), "workqueue_adds_total", "workqueue_depth", "apiserver_request_total")
	if err != nil {
		t.Fatal(err)
	}
	if len(samples) != 4 {
		t.Fatalf("got %d samples, want 4: %+v", len(samples), samples)
	}
	if s := samples[1]; s.labels["name"] != "strata-volume" || s.value != 3000 {
		t.Errorf("second sample %+v", s)
	}
	if s := samples[3]; s.labels["verb"] != "POST" || s.labels["odd"] != `a"b,c}` || s.value != 7 {
		t.Errorf("escaped label or timestamp mishandled: %+v", s)
	}
	if _, err := parseMetrics(strings.NewReader(`workqueue_depth{name="x 1`+"\n"), "workqueue_depth"); err == nil {
		t.Error("an unterminated label is an error")
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	if p := percentile(d, 0.5); p != 50*time.Millisecond {
		t.Errorf("p50 = %s", p)
	}
	if p := percentile(d, 0.99); p != 99*time.Millisecond {
		t.Errorf("p99 = %s", p)
	}
	if p := percentile(d[:1], 0.99); p != time.Millisecond {
		t.Errorf("p99 of one = %s", p)
	}
}
