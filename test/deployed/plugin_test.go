package deployed

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// kubectlStrata runs the plugin as kubectl would (the binary under the
// name kubectl-strata) with the admin's kubeconfig, and returns its
// standard output, standard error and error.
func kubectlStrata(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	return kubectlStrataAs(t, env.cluster.AdminKubeconfig, args...)
}

// kubectlStrataAs runs the plugin with the kubeconfig at path.
func kubectlStrataAs(t *testing.T, kubeconfig string, args ...string) (string, string, error) {
	t.Helper()
	plugin := filepath.Join(t.TempDir(), "kubectl-strata")
	require.NoError(t, os.Symlink(env.bin, plugin))
	cmd := exec.Command(plugin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	t.Logf("kubectl strata %s\n%s%s", strings.Join(args, " "), stdout.String(), stderr.String())
	return stdout.String(), stderr.String(), err
}

// plugin runs kubectl strata and requires it to succeed.
func plugin(t *testing.T, args ...string) []string {
	t.Helper()
	out, _, err := kubectlStrata(t, args...)
	require.NoError(t, err)
	return strings.Split(strings.TrimRight(out, "\n"), "\n")
}

// kubectl strata driven as a script, each output line checked: a volume
// created, listed and expanded, a snapshot taken, listed (as a table and
// as JSON) and deleted, an attachment made and removed, the volume
// reverted to the snapshot, a backing image created and uploaded from a
// file, listed, downloaded back byte for byte and deleted, a quota set,
// shown, refused bad input and removed, the volume deleted.
func testKubectlStrataPlugin(t *testing.T) {
	logsOnFailure(t)
	const wns = "plugin-d"
	kubectl(t, "create", "namespace", wns)
	t.Cleanup(func() { _, _ = kubectlOut(context.Background(), "delete", "namespace", wns, "--wait=false") })
	t.Cleanup(func() {
		_, _ = kubectlOut(context.Background(), "-n", ns, "delete", "volume", "plug-v1", "--wait=false")
	})

	assert.Equal(t, []string{"volume/plug-v1 created"}, plugin(t, "volume", "create", "plug-v1", "--size", "16Mi", "--replicas", "2"))
	lines := plugin(t, "volume", "ls")
	require.Regexp(t, `^NAME\s+SIZE\s+REPLICAS\s+STATE\s+ROBUSTNESS\s+NODE\s+AGE$`, lines[0])
	assert.True(t, slicesMatch(lines[1:], `^plug-v1\s+16Mi\s+2\s+\S+\s+\S+\s+\S+\s+\S+$`), "the volume's row")

	assert.Equal(t, []string{"snapshot/p1 of volume/plug-v1 created"}, plugin(t, "snapshot", "create", "plug-v1", "p1", "--label", "app=db"))
	require.Eventually(t, func() bool {
		lines := plugin(t, "snapshot", "ls", "plug-v1")
		return regexp.MustCompile(`^NAME\s+SIZE\s+READY\s+USER\s+PARENT\s+AGE$`).MatchString(lines[0]) &&
			slicesMatch(lines[1:], `^p1\s+\S+\s+true\s+true\s+\S+\s+\S+$`)
	}, 2*time.Minute, time.Second, "the snapshot is listed ready")
	var snaps struct {
		Items []v1beta1.Snapshot `json:"items"`
	}
	out, _, err := kubectlStrata(t, "snapshot", "ls", "plug-v1", "-o", "json")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal([]byte(out), &snaps))
	require.Len(t, snaps.Items, 1)
	assert.Equal(t, map[string]string{"app": "db"}, snaps.Items[0].Spec.Labels)

	lines = plugin(t, "volume", "attach", "plug-v1", "--node", "127.0.0.1", "--ttl", "1m")
	m := regexp.MustCompile(`^volume/plug-v1: ticket (api-[a-z0-9]+) on 127\.0\.0\.1, lasts until \S+ unless renewed$`).FindStringSubmatch(lines[0])
	require.NotNil(t, m, lines[0])
	require.Eventually(t, func() bool { return getVolume(t, "plug-v1").Status.CurrentNodeID == "127.0.0.1" },
		time.Minute, 250*time.Millisecond, "attached")
	assert.Equal(t, []string{"volume/plug-v1: ticket " + m[1] + " removed"}, plugin(t, "volume", "detach", "plug-v1", "--ticket", m[1]))
	require.Eventually(t, func() bool { return getVolume(t, "plug-v1").Status.State == v1beta1.VolumeStateDetached },
		time.Minute, 250*time.Millisecond, "detached")
	assert.Equal(t, []string{"volume/plug-v1 reverted to snapshot/p1"}, plugin(t, "volume", "revert", "plug-v1", "--snapshot", "p1"))

	assert.Equal(t, []string{"quota of namespace plugin-d set to 10Gi"}, plugin(t, "quota", "set", wns, "10Gi"))
	lines = plugin(t, "quota", "show", wns)
	require.Len(t, lines, 2)
	assert.Regexp(t, `^SUBJECT\s+USED\s+QUOTA$`, lines[0])
	assert.Regexp(t, `^namespace/plugin-d\s+\S+\s+10Gi$`, lines[1])
	_, stderr, err := kubectlStrata(t, "quota", "set", wns, "abc")
	require.Error(t, err)
	assert.Equal(t, "error: totalSnapshotSizeQuota: \"abc\" is not a size (a quantity such as 10Gi) (HTTP 400)\n", stderr)
	assert.Equal(t, []string{"quota of namespace plugin-d removed"}, plugin(t, "quota", "rm", wns))

	raw := filepath.Join(t.TempDir(), "img.raw")
	runCmd(t, "dd", "if=/dev/urandom", "of="+raw, "bs=1M", "count=4")
	t.Cleanup(func() {
		_, _ = kubectlOut(context.Background(), "-n", ns, "delete", "backingimage", "plug-img", "--wait=false")
	})
	assert.Equal(t, []string{"backingimage/plug-img created"}, plugin(t, "image", "create", "plug-img", "--upload"))
	lines = plugin(t, "image", "upload", "plug-img", raw)
	require.Len(t, lines, 1)
	assert.Equal(t, "backingimage/plug-img: 4Mi uploaded, 4Mi of raw image, sha512 "+sha512File(t, raw), lines[0])
	lines = plugin(t, "image", "ls")
	require.Regexp(t, `^NAME\s+SOURCE\s+SIZE\s+COPIES\s+AGE$`, lines[0])
	assert.True(t, slicesMatch(lines[1:], `^plug-img\s+upload\s+\S+\s+\S+\s+\S+$`), "the image's row")
	got := filepath.Join(t.TempDir(), "got.raw")
	assert.Equal(t, []string{"backingimage/plug-img: 4Mi written to " + got + " (4Mi received)"},
		plugin(t, "image", "download", "plug-img", got))
	assert.Equal(t, sha512File(t, raw), sha512File(t, got), "the download is the image")
	assert.Equal(t, []string{"backingimage/plug-img deleted"}, plugin(t, "image", "rm", "plug-img"))

	t.Cleanup(func() {
		_, _ = kubectlOut(context.Background(), "-n", ns, "delete", "volume", "plug-clone", "--wait=false")
	})
	assert.Equal(t, []string{"volume/plug-clone created", "volume/plug-clone: clone completed"},
		plugin(t, "volume", "create", "plug-clone", "--size", "16Mi", "--data-source", "snap://plug-v1/p1", "--wait"))
	require.Eventually(t, func() bool { return getVolume(t, "plug-clone").Status.State == v1beta1.VolumeStateDetached },
		time.Minute, 250*time.Millisecond, "the clone detached")
	assert.Equal(t, []string{"volume/plug-clone deleted"}, plugin(t, "volume", "rm", "plug-clone"))
	assert.Equal(t, []string{"snapshot/p1 of volume/plug-v1 deleted"}, plugin(t, "snapshot", "rm", "plug-v1", "p1"))
	assert.Equal(t, []string{"volume/plug-v1 expanded to 32Mi"}, plugin(t, "volume", "expand", "plug-v1", "--size", "32Mi"))
	require.Eventually(t, func() bool { return getVolume(t, "plug-v1").Status.State == v1beta1.VolumeStateDetached },
		time.Minute, 250*time.Millisecond, "detached")
	assert.Equal(t, []string{"volume/plug-v1 deleted"}, plugin(t, "volume", "rm", "plug-v1"))
}

// slicesMatch tells whether some line matches pattern.
func slicesMatch(lines []string, pattern string) bool {
	re := regexp.MustCompile(pattern)
	for _, l := range lines {
		if re.MatchString(l) {
			return true
		}
	}
	return false
}

// A user whose kubeconfig holds only a client certificate of the cluster's
// CA (as kubeadm's admin.conf does) uses kubectl strata as is: the API
// verifies the certificate against the client CA the API server publishes,
// the access reviews judge the certificate's user and groups, and the
// writes are the manager's own after that review, naming the user (the
// manager cannot impersonate). A verb RBAC does not grant the group is a 403
// naming the user; a certificate of another CA is refused.
func testKubectlStrataWithAClientCertificate(t *testing.T) {
	logsOnFailure(t)
	const user, group = "cert-alice", "strata-cert-users"
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, env.cluster.ClientCertificateKubeconfig(kubeconfig, user, group))
	kubectl(t, "-n", ns, "create", "role", "cert-users", "--verb=get,list,create", "--resource=volumes.strata.io,nodes.strata.io")
	kubectl(t, "-n", ns, "create", "rolebinding", "cert-users", "--role=cert-users", "--group="+group)
	t.Cleanup(func() {
		_, _ = kubectlOut(context.Background(), "-n", ns, "delete", "rolebinding,role", "cert-users")
		_, _ = kubectlOut(context.Background(), "-n", ns, "delete", "volume", "cert-v1", "--wait=false")
	})
	as := func(args ...string) (string, string, error) { return kubectlStrataAs(t, kubeconfig, args...) }

	out, _, err := as("volume", "create", "cert-v1", "--size", "16Mi", "--replicas", "1")
	require.NoError(t, err)
	assert.Equal(t, "volume/cert-v1 created\n", out)
	out, _, err = as("volume", "ls")
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^cert-v1\s+16Mi\s+1\s`, out)
	// Made with the manager's rights after cert-alice's review: the
	// volume and an event name her.
	assert.Equal(t, user, getVolume(t, "cert-v1").Annotations[types.AnnotationRequestedBy])
	require.Eventually(t, func() bool { // the recorder sends events in the background
		out = kubectl(t, "-n", ns, "get", "events", "--field-selector", "involvedObject.name=cert-v1,reason=WrittenForUser",
			"-o", "jsonpath={.items[*].message}")
		return strings.Contains(out, "created for cert-alice (client certificate)")
	}, 30*time.Second, 500*time.Millisecond, "events: %s", out)

	_, stderr, err := as("volume", "rm", "cert-v1")
	require.Error(t, err)
	assert.Contains(t, stderr, `user "cert-alice" may not delete volumes.strata.io "cert-v1"`)
	assert.Contains(t, stderr, "(HTTP 403)")
	getVolume(t, "cert-v1") // still there

	// A certificate the cluster's CA did not sign is refused in the
	// handshake, whatever groups it names.
	c := newRESTClient(t, "127.0.0.1", "")
	c.http.Transport.(*http.Transport).TLSClientConfig.Certificates = []tls.Certificate{selfSignedClientCertificate(t, "mallory", "system:masters")}
	req, err := http.NewRequest("GET", "https://"+c.addr+"/v1/volumes", nil)
	require.NoError(t, err)
	resp, err := c.http.Do(req)
	if err == nil {
		resp.Body.Close()
	}
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bad certificate")
}

// selfSignedClientCertificate is a client certificate of no known CA.
func selfSignedClientCertificate(t *testing.T, user string, groups ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: user, Organization: groups},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
