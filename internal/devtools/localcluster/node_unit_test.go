package localcluster

import (
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

func TestCertAuthorityIssues(t *testing.T) {
	dir := t.TempDir()
	ca, err := newCertAuthority(dir)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(ca.CertPEM))

	tests := []struct {
		name  string
		req   certRequest
		usage x509.ExtKeyUsage
	}{
		{"kubelet client", certRequest{CommonName: "system:node:127.0.0.2", Groups: []string{"system:nodes"}}, x509.ExtKeyUsageClientAuth},
		{"kubelet serving", certRequest{CommonName: "127.0.0.2", IPs: []net.IP{net.ParseIP("127.0.0.2")}, Server: true}, x509.ExtKeyUsageServerAuth},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			certPEM, keyPEM, err := ca.issue(base, tc.req)
			require.NoError(t, err)
			require.NotEmpty(t, keyPEM)
			block, _ := pem.Decode(certPEM)
			require.NotNil(t, block)
			cert, err := x509.ParseCertificate(block.Bytes)
			require.NoError(t, err)
			_, err = cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{tc.usage}})
			require.NoError(t, err, "signed by the CA for its usage")
			assert.Equal(t, tc.req.CommonName, cert.Subject.CommonName)
			assert.Equal(t, tc.req.Groups, cert.Subject.Organization)
			if tc.req.Server {
				require.NoError(t, cert.VerifyHostname("127.0.0.2"))
			}
			info, err := os.Stat(base + ".key")
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "private keys are owner-only")
		})
	}
}

// Every path a node's containerd and kubelet write to is under the node
// directory, so nodes on one machine never share state and teardown finds
// all of it.
func TestNodeConfigsStayInTheNodeDirectory(t *testing.T) {
	c := &Cluster{Dir: "/tmp/strata-test-cluster", log: logrus.New()}
	n := c.newNode("127.0.0.2")
	n.KubeletPort, n.healthPort = 40000, 40001

	// containerd itself reads the file: `config dump` prints what it made of it.
	binDir, err := BuildTools(t.Context(), logrus.New())
	require.NoError(t, err)
	cfg := filepath.Join(t.TempDir(), "config.toml")
	require.NoError(t, os.WriteFile(cfg, []byte(n.containerdConfig()), 0o644))
	out, err := exec.Command(filepath.Join(binDir, "containerd"), "--config", cfg, "config", "dump").CombinedOutput()
	require.NoError(t, err, "%s", out)
	dump := string(out)
	for _, want := range []string{
		"root = '" + n.Dir + "/containerd/root'", "state = '" + n.Dir + "/containerd/state'",
		"address = '" + n.ContainerdSocket() + "'", "address = '" + n.ContainerdSocket() + ".ttrpc'",
		"Root = '" + n.Dir + "/runc'", "netns_mounts_under_state_dir = true", "conf_dir = '" + n.Dir + "/cni-conf'",
	} {
		assert.Contains(t, dump, want)
	}
	assert.Contains(t, n.containerdConfig(), "restrict_oom_score_adj = true")
	assert.Contains(t, n.containerdConfig(), "SystemdCgroup = false")

	data, err := n.kubeletConfig()
	require.NoError(t, err)
	var kubelet map[string]any
	require.NoError(t, yaml.Unmarshal(data, &kubelet))
	for _, key := range []string{"staticPodPath", "podLogsDir", "volumePluginDir", "tlsCertFile", "tlsPrivateKeyFile"} {
		assert.True(t, strings.HasPrefix(kubelet[key].(string), n.Dir+"/"), "kubelet %s = %v", key, kubelet[key])
	}
	assert.Equal(t, "127.0.0.2", kubelet["address"])
	assert.Equal(t, n.cgroupRoot, kubelet["cgroupRoot"])
	assert.Equal(t, false, kubelet["failCgroupV1"])
	assert.True(t, strings.HasPrefix(n.cgroupRoot, "/"+cgroupPrefix(c.Dir)), "cgroup root %s carries the cluster prefix", n.cgroupRoot)
	assert.NotEqual(t, n.cgroupRoot, (&Cluster{Dir: "/tmp/other", log: c.log}).newNode("127.0.0.2").cgroupRoot,
		"another cluster's node of the same name gets other cgroups")
}

func TestStartNodesRejectsNonLoopbackNames(t *testing.T) {
	bin := t.TempDir()
	for _, name := range []string{"kubelet", "containerd", "containerd-shim-runc-v2", "ctr"} {
		writeFile(t, filepath.Join(bin, name), "#!/bin/sh\nexit 1\n")
	}
	c := &Cluster{Dir: t.TempDir(), BinDir: bin, log: logrus.New()}
	tests := []struct {
		names   []string
		wantErr string
	}{
		{[]string{"node-1"}, "must be an IPv4 loopback address"},
		{[]string{"127.0.0.1", "10.0.0.1"}, "must be an IPv4 loopback address"},
		{[]string{"::1"}, "must be an IPv4 loopback address"},
		{[]string{"127.0.0.2", "127.0.0.2"}, "given twice"},
	}
	for _, tc := range tests {
		_, err := c.StartNodes(t.Context(), NodeOptions{Names: tc.names})
		require.Error(t, err, "%v", tc.names)
		assert.Contains(t, err.Error(), tc.wantErr, "%v", tc.names)
	}
	assert.Empty(t, c.Nodes(), "nothing started")

	deep := &Cluster{Dir: filepath.Join(t.TempDir(), strings.Repeat("d", 80)), BinDir: bin, log: logrus.New()}
	_, err := deep.StartNodes(t.Context(), NodeOptions{Names: []string{"127.0.0.1"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "use a shorter cluster directory")
}
