package deployed

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// restClient calls one manager's REST API as a user does: HTTPS trusting
// the CA bundle Strata publishes, a bearer token of the cluster.
type restClient struct {
	t     *testing.T
	http  *http.Client
	addr  string
	token string
}

func newRESTClient(t *testing.T, node, token string) *restClient {
	t.Helper()
	cm, err := env.kube.CoreV1().ConfigMaps(ns).Get(context.Background(), types.CABundleConfigMap, metav1.GetOptions{})
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM([]byte(cm.Data[types.CABundleKey])), "the published CA bundle")
	n, err := env.strata.StrataV1beta1().Nodes(ns).Get(context.Background(), node, metav1.GetOptions{})
	require.NoError(t, err)
	require.NotEmpty(t, n.Status.APIAddress)
	return &restClient{t: t, addr: n.Status.APIAddress, token: token, http: &http.Client{Timeout: 30 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}}
}

// do sends body (JSON unless nil) and returns the status and the decoded
// JSON reply (nil when there is none).
func (c *restClient) do(method, path string, body any) (int, map[string]any) {
	c.t.Helper()
	var in io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(c.t, err)
		in = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "https://"+c.addr+path, in)
	require.NoError(c.t, err)
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	var out map[string]any
	if len(raw) > 0 && resp.Header.Get("Content-Type") == "application/json" {
		require.NoError(c.t, json.Unmarshal(raw, &out), "%s %s: %s", method, path, raw)
	}
	c.t.Logf("%s %s -> %d %s", method, path, resp.StatusCode, truncate(string(raw), 200))
	return resp.StatusCode, out
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// serviceAccountToken makes a ServiceAccount in podNamespace bound to
// clusterRole (in namespace when set, else cluster-wide) and returns a
// token of it; both go when the test ends.
func serviceAccountToken(t *testing.T, name, clusterRole, namespace string) string {
	t.Helper()
	kubectl(t, "-n", podNamespace, "create", "serviceaccount", name)
	t.Cleanup(func() { _, _ = kubectlOut(context.Background(), "-n", podNamespace, "delete", "serviceaccount", name) })
	subject := "--serviceaccount=" + podNamespace + ":" + name
	if namespace != "" {
		kubectl(t, "-n", namespace, "create", "rolebinding", name, "--clusterrole="+clusterRole, subject)
		t.Cleanup(func() { _, _ = kubectlOut(context.Background(), "-n", namespace, "delete", "rolebinding", name) })
	} else {
		kubectl(t, "create", "clusterrolebinding", name, "--clusterrole="+clusterRole, subject)
		t.Cleanup(func() { _, _ = kubectlOut(context.Background(), "delete", "clusterrolebinding", name) })
	}
	ttl := int64(time.Hour.Seconds())
	tr, err := env.kube.CoreV1().ServiceAccounts(podNamespace).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return tr.Status.Token
}

// The REST API on the install, with the real API server judging tokens
// and access: 401 without a token, 403 for the seed's read-only quota
// user, 400 naming the field, and the admin's volume, snapshot and quota
// actions done for real. An attach whose client never renews it lapses:
// the reaper removes the ticket and the volume detaches.
func testRESTAPI(t *testing.T) {
	logsOnFailure(t)
	const wns = "rest-d"
	kubectl(t, "create", "namespace", wns)
	t.Cleanup(func() { _, _ = kubectlOut(context.Background(), "delete", "namespace", wns, "--wait=false") })
	admin := newRESTClient(t, "127.0.0.1", serviceAccountToken(t, "rest-admin", "cluster-admin", ""))
	reader := newRESTClient(t, "127.0.0.2", serviceAccountToken(t, "rest-quota-reader", "strata-resourcequota-view", wns))
	anonymous := newRESTClient(t, "127.0.0.3", "")

	code, body := anonymous.do("GET", "/v1/volumes", nil)
	assert.Equal(t, http.StatusUnauthorized, code)
	assert.Contains(t, body["error"], "no Authorization header")

	quotaPath := "/v1/namespaces/" + wns + "?action=updateResourceQuota"
	code, body = reader.do("POST", quotaPath, map[string]string{"totalSnapshotSizeQuota": "10Gi"})
	assert.Equal(t, http.StatusForbidden, code)
	assert.Equal(t, "update", body["verb"])
	assert.Equal(t, "resourcequotas.strata.io", body["resource"])
	for _, bad := range []string{"-1Gi", "abc"} {
		code, body = admin.do("POST", quotaPath, map[string]string{"totalSnapshotSizeQuota": bad})
		assert.Equal(t, http.StatusBadRequest, code, bad)
		assert.Equal(t, "totalSnapshotSizeQuota", body["field"], bad)
	}
	code, _ = admin.do("POST", quotaPath, map[string]string{"totalSnapshotSizeQuota": "10Gi"})
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, "10Gi", kubectl(t, "-n", wns, "get", "srq", v1beta1.DefaultResourceQuotaName,
		"-o", "jsonpath={.spec.snapshotLimit.namespaceTotalSnapshotSizeQuota}"))
	code, _ = admin.do("POST", "/v1/namespaces/"+wns+"?action=deleteResourceQuota", nil)
	require.Equal(t, http.StatusOK, code)
	code, body = admin.do("POST", "/v1/namespaces/"+wns+"?action=resize", nil)
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Equal(t, "action", body["field"])

	code, _ = admin.do("POST", "/v1/volumes", map[string]any{"name": "rest-v1", "size": "16Mi", "numberOfReplicas": 2})
	require.Equal(t, http.StatusCreated, code)
	t.Cleanup(func() {
		_, _ = kubectlOut(context.Background(), "-n", ns, "delete", "volume", "rest-v1", "--wait=false")
	})
	code, _ = reader.do("POST", "/v1/volumes/rest-v1?action=snapshotCRCreate", map[string]string{"name": "rest-s1"})
	assert.Equal(t, http.StatusForbidden, code, "the quota reader may not snapshot")
	code, _ = admin.do("POST", "/v1/volumes/rest-v1?action=snapshotCRCreate", map[string]string{"name": "rest-s1"})
	require.Equal(t, http.StatusOK, code)
	require.Eventually(t, func() bool {
		_, body := admin.do("POST", "/v1/volumes/rest-v1?action=snapshotCRGet", map[string]string{"name": "rest-s1"})
		st, _ := body["status"].(map[string]any)
		return st["readyToUse"] == true
	}, 2*time.Minute, time.Second, "the snapshot taken through the API is ready")
	code, body = admin.do("POST", "/v1/volumes/rest-v1?action=snapshotCRList", nil)
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, itemNames(body), "rest-s1", "the list holds the snapshot (and any the system took, for a rebuild)")
	code, _ = admin.do("POST", "/v1/volumes/rest-v1?action=snapshotCRDelete", map[string]string{"name": "rest-s1"})
	assert.Equal(t, http.StatusNoContent, code)

	// A client attaches with a 10 s lease and vanishes.
	start := time.Now()
	code, body = admin.do("POST", "/v1/volumes/rest-v1?action=attach", map[string]any{"node": "127.0.0.2", "ttlSeconds": 10})
	require.Equal(t, http.StatusOK, code)
	ticket := body["ticketID"].(string)
	require.Eventually(t, func() bool {
		v := getVolume(t, "rest-v1")
		return v.Status.State == v1beta1.VolumeStateAttached && v.Status.CurrentNodeID == "127.0.0.2"
	}, time.Minute, 250*time.Millisecond, "attached through the API's ticket")
	require.Eventually(t, func() bool {
		va, err := env.strata.StrataV1beta1().VolumeAttachments(ns).Get(context.Background(), "rest-v1", metav1.GetOptions{})
		return err == nil && va.Spec.AttachmentTickets[ticket] == nil && getVolume(t, "rest-v1").Status.State == v1beta1.VolumeStateDetached
	}, time.Minute, 250*time.Millisecond, "the lapsed ticket is removed and the volume detached")
	t.Logf("a vanished client's attachment ended %s after the attach (lease 10 s)", time.Since(start).Round(time.Millisecond))
	_, err := env.kube.CoordinationV1().Leases(ns).Get(context.Background(), "strata-"+ticket, metav1.GetOptions{})
	assert.Error(t, err, "the lapsed Lease is gone")

	// A client that detaches itself.
	code, body = admin.do("POST", "/v1/volumes/rest-v1?action=attach", map[string]any{"node": "127.0.0.3"})
	require.Equal(t, http.StatusOK, code)
	code, _ = admin.do("POST", "/v1/volumes/rest-v1?action=detach", map[string]any{"ticketID": body["ticketID"]})
	assert.Equal(t, http.StatusNoContent, code)
	code, _ = admin.do("POST", "/v1/volumes/rest-v1?action=expand", map[string]any{"size": "32Mi"})
	assert.Equal(t, http.StatusOK, code)
	require.Eventually(t, func() bool { return getVolume(t, "rest-v1").Status.State == v1beta1.VolumeStateDetached },
		time.Minute, 250*time.Millisecond, "detached before the delete")
	code, _ = admin.do("DELETE", "/v1/volumes/rest-v1", nil)
	assert.Equal(t, http.StatusNoContent, code)
	code, _ = admin.do("GET", "/v1/openapi.yaml", nil)
	assert.Equal(t, http.StatusOK, code)
}

// restSnapshot takes a snapshot of volume through the REST API and waits
// until it is taken; it goes when the test ends.
func restSnapshot(t *testing.T, admin *restClient, volume, name string) {
	t.Helper()
	code, _ := admin.do("POST", "/v1/volumes/"+volume+"?action=snapshotCRCreate", map[string]string{"name": name})
	require.Equal(t, http.StatusOK, code)
	t.Cleanup(func() { _, _ = kubectlOut(context.Background(), "-n", ns, "delete", "snapshot", name, "--wait=false") })
	require.Eventually(t, func() bool {
		s, err := env.strata.StrataV1beta1().Snapshots(ns).Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && s.Status.ReadyToUse
	}, time.Minute, 250*time.Millisecond, "snapshot %s ready", name)
}

// Revert through the REST API, as the seed's users reach it: a block
// claim written by a Pod (pattern 1), a snapshot, then pattern 2 and a
// second snapshot. While the Pod holds the volume the revert is refused
// (409); once the Pod is gone it is reverted to the first snapshot: a new
// Pod reads pattern 1 byte for byte, and the later snapshot is still
// listed.
func testRESTRevert(t *testing.T) {
	logsOnFailure(t)
	admin := newRESTClient(t, "127.0.0.1", serviceAccountToken(t, "rest-revert-admin", "cluster-admin", ""))
	claimIn(t, podNamespace, "rv", "16Mi", "volumeMode: Block")
	podIn(t, podNamespace, "rv-1", "127.0.0.2", "rv", "exec sleep 3600", true)
	volume := volumeOfClaim(t, "rv")
	write := func(pattern string) string {
		return exec1(t, "rv-1", "dd if=/dev/urandom of=/tmp/p bs=1M count=16 2>/dev/null && dd if=/tmp/p of="+blockDevice+
			" bs=1M oflag=direct conv=fsync 2>/dev/null && sha256sum /tmp/p | cut -d' ' -f1")
	}
	snapshot := func(name string) { restSnapshot(t, admin, volume, name) }
	first := write("1")
	snapshot("rv-s1")
	second := write("2")
	require.NotEqual(t, first, second)
	snapshot("rv-s2")

	code, body := admin.do("POST", "/v1/volumes/"+volume+"?action=revert", map[string]string{"snapshot": "rv-s1"})
	assert.Equal(t, http.StatusConflict, code, "refused while the Pod holds the volume")
	assert.Contains(t, body["error"], "csi-attacher")

	kubectl(t, "-n", podNamespace, "delete", "pod", "rv-1", "--grace-period=1")
	require.Eventually(t, func() bool {
		va, err := env.strata.StrataV1beta1().VolumeAttachments(ns).Get(context.Background(), volume, metav1.GetOptions{})
		return err == nil && len(va.Spec.AttachmentTickets) == 0 && getVolume(t, volume).Status.State == v1beta1.VolumeStateDetached
	}, 2*time.Minute, 250*time.Millisecond, "the Pod's attachment is gone")
	start := time.Now()
	code, _ = admin.do("POST", "/v1/volumes/"+volume+"?action=revert", map[string]string{"snapshot": "rv-s1"})
	require.Equal(t, http.StatusOK, code)
	t.Logf("revert (attach without frontend, revert, detach) took %s", time.Since(start).Round(time.Millisecond))
	require.Eventually(t, func() bool {
		out, err := kubectlOut(context.Background(), "-n", ns, "get", "events", "--field-selector",
			"involvedObject.name="+volume+",reason=Reverted", "-o", "jsonpath={.items[*].message}")
		return err == nil && strings.Contains(out, "reverted to snapshot rv-s1 by system:serviceaccount:default:rest-revert-admin")
	}, 30*time.Second, 250*time.Millisecond, "the volume's Reverted event names the snapshot and the user")

	podIn(t, podNamespace, "rv-2", "127.0.0.3", "rv", "exec sleep 3600", true)
	assert.Equal(t, first, exec1(t, "rv-2", "dd if="+blockDevice+" bs=1M count=16 iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1"),
		"the volume reads as the first snapshot")
	_, body = admin.do("POST", "/v1/volumes/"+volume+"?action=snapshotCRList", nil)
	assert.Subset(t, itemNames(body), []string{"rv-s1", "rv-s2"}, "the later snapshot stays")

	// What a Prometheus scraping the managers now sees: the workqueues of
	// the controllers this test drove, the gRPC calls of its snapshots and
	// revert, and the snapshotted volume's series, from one manager.
	var scrapes []map[string]*dto.MetricFamily
	for _, node := range env.nodes {
		scrapes = append(scrapes, scrape(t, node))
	}
	for _, queue := range []string{"strata-volume", "strata-engine", "strata-replica", "strata-volume-attachment",
		"strata-snapshot", "strata-node", "strata-instance-manager", "strata-instance-manager-rollout"} {
		adds, _ := sumOver(scrapes, "workqueue_adds_total", map[string]string{"name": queue})
		assert.Positive(t, adds, "workqueue_adds_total of %s", queue)
	}
	for _, method := range []string{"/strata.instancemanager.v1.InstanceManager/SnapshotCreate", "/strata.instancemanager.v1.InstanceManager/SnapshotRevert"} {
		calls, _ := sumOver(scrapes, "strata_engineapi_call_duration_seconds", map[string]string{"method": method})
		assert.Positive(t, calls, "strata_engineapi_call_duration_seconds of %s", method)
	}
	snaps, series := sumOver(scrapes, "strata_volume_snapshots", map[string]string{"volume": volume})
	assert.Equal(t, 1, series, "one manager reports the volume")
	assert.GreaterOrEqual(t, snaps, 2.0, "its snapshots")
	healthy, _ := sumOver(scrapes, "strata_volume_robustness", map[string]string{"volume": volume, "robustness": "healthy"})
	assert.Equal(t, 1.0, healthy)
	_, sizes := sumOver(scrapes, "strata_volume_actual_size_bytes", map[string]string{"volume": volume})
	assert.Equal(t, 1, sizes)
	// The engine's per-replica latency, gathered from the instance manager
	// of the node rv-2 reads on: one series per replica, each one read.
	reads, readSeries := sumOver(scrapes, "strata_engine_replica_io_duration_seconds", map[string]string{"volume": volume, "op": "read"})
	assert.Equal(t, int(getVolume(t, volume).Spec.NumberOfReplicas), readSeries, "a read-latency series per replica")
	assert.GreaterOrEqual(t, reads, 16.0, "the reads of rv-2's checksum")

	// Without a token no metrics; the probes' paths answer anyone.
	anonymous := newRESTClient(t, env.nodes[0], "")
	anonymous.addr = fmt.Sprintf("%s:%v", env.nodes[0], env.chart.Values["ports"].(map[string]any)["metrics"])
	code, _ = anonymous.do("GET", "/metrics", nil)
	assert.Equal(t, http.StatusUnauthorized, code)
	code, _ = anonymous.do("GET", "/healthz", nil)
	assert.Equal(t, http.StatusOK, code)
}

// itemNames are the names of a list reply's items.
func itemNames(body map[string]any) []string {
	items, _ := body["items"].([]any)
	var names []string
	for _, item := range items {
		names = append(names, item.(map[string]any)["metadata"].(map[string]any)["name"].(string))
	}
	return names
}
