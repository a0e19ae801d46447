package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
)

// ChartOptions says how InstallChart deploys Strata's Helm chart onto the
// kubelet nodes: the images (built and imported by the caller) and the
// values that differ from a real cluster's.
type ChartOptions struct {
	RepoRoot  string
	Namespace string
	// Release is the Helm release name; empty: strata.
	Release string
	// Image is the strata-manager image, repository:tag.
	Image string
	// SidecarImages are the upstream sidecars' images by program name
	// (ChartSidecars).
	SidecarImages map[string]string
	// Values are more chart values, merged over the ones InstallChart sets.
	Values map[string]any
	// Timeout bounds helm's wait for every Pod to be ready; zero: 5 minutes.
	Timeout time.Duration
}

// ChartRelease is the release name InstallChart uses by default.
const ChartRelease = "strata"

// ChartSnapshotMetadataPort is the chart's ports.snapshotMetadata default
// (package/chart/strata/values.yaml).
const ChartSnapshotMetadataPort = 9502

// StrataDir is the node's hostDir in the chart: the instance manager's
// state, TLS files, NBD socket and the CSI node plugin's state.
func (n *Node) StrataDir() string { return n.path("strata") }

// DiskDir is the node's one Strata disk when the chart is installed.
func (n *Node) DiskDir() string { return n.path("disks", "disk-1") }

// InstallChart installs package/chart/strata with helm (built into the
// tools cache) and waits for its Pods. The three nodes share one host, so
// each gets its own directories (the chart's nodeDirs and disks.perNode),
// and since no kube-proxy routes Service addresses here, the Pods reach the
// API server at its own address (kubernetesAPI) and the webhooks are called
// at the leading manager's address (see chartValues).
func (c *Cluster) InstallChart(ctx context.Context, opts ChartOptions) error {
	if len(c.nodes) == 0 {
		return fmt.Errorf("InstallChart: no kubelet node runs")
	}
	for _, n := range c.nodes {
		if err := n.prepareChartDirs(); err != nil {
			return err
		}
	}
	helmDir, err := BuildTools(ctx, c.log, "helm")
	if err != nil {
		return err
	}
	values, err := c.chartValues(opts)
	if err != nil {
		return err
	}
	valuesFile := c.path("helm-values.json")
	if err := os.WriteFile(valuesFile, values, 0o600); err != nil {
		return err
	}
	release := opts.Release
	if release == "" {
		release = ChartRelease
	}
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = 5 * time.Minute
	}
	start := time.Now()
	out, err := c.helm(ctx, filepath.Join(helmDir, "helm"), "upgrade", "--install", release,
		filepath.Join(opts.RepoRoot, "package", "chart", "strata"), "--namespace", opts.Namespace, "--create-namespace",
		"--values", valuesFile, "--wait", "--timeout", timeout.String())
	if err != nil {
		return fmt.Errorf("helm install: %w\n%s", err, out)
	}
	c.log.WithFields(logrus.Fields{"release": release, "namespace": opts.Namespace,
		"took": time.Since(start).Round(time.Millisecond)}).Info("Helm chart installed; every Pod is ready")
	return nil
}

// UninstallChart removes the release (its pre-delete checks included).
func (c *Cluster) UninstallChart(ctx context.Context, namespace, release string) (string, error) {
	helmDir, err := BuildTools(ctx, c.log, "helm")
	if err != nil {
		return "", err
	}
	if release == "" {
		release = ChartRelease
	}
	return c.helm(ctx, filepath.Join(helmDir, "helm"), "uninstall", release, "--namespace", namespace, "--wait")
}

func (c *Cluster) helm(ctx context.Context, bin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, append(args, "--kubeconfig", c.AdminKubeconfig)...)
	// helm keeps its caches and repositories config under HOME; none is used.
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+c.path("helm", "cache"),
		"HELM_CONFIG_HOME="+c.path("helm", "config"), "HELM_DATA_HOME="+c.path("helm", "data"))
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// chartValues are the values of the local cluster, as JSON (which helm
// reads as YAML).
func (c *Cluster) chartValues(opts ChartOptions) ([]byte, error) {
	repo, tag, ok := strings.Cut(opts.Image, ":")
	if !ok {
		return nil, fmt.Errorf("InstallChart: image %q has no tag", opts.Image)
	}
	api, err := url.Parse(c.APIServerURL)
	if err != nil {
		return nil, err
	}
	nodeDirs, perNode := map[string]any{}, map[string]any{}
	for _, n := range c.nodes {
		nodeDirs[n.Name] = map[string]any{"hostDir": n.StrataDir(), "kubeletRoot": n.KubeletRoot()}
		perNode[n.Name] = []string{n.DiskDir()}
	}
	sidecar := func(name string) map[string]any { return map[string]any{"image": opts.SidecarImages[name]} }
	values := map[string]any{
		"image":         map[string]any{"repository": repo, "tag": tag, "pullPolicy": "Never"},
		"kubernetesAPI": map[string]any{"host": api.Hostname(), "port": api.Port()},
		"nodeDirs":      nodeDirs,
		"disks":         map[string]any{"perNode": perNode},
		// The nodes' loopback addresses cannot be Service endpoints
		// (EndpointSlice validation refuses 127.0.0.0/8), so the leading
		// manager points the webhook configurations at its own address.
		"manager": map[string]any{"flags": map[string]any{"webhook-url-host": "$(HOST_IP)"}},
		"csiController": map[string]any{"pullPolicy": "Never", "sidecars": map[string]any{
			"provisioner": sidecar("csi-provisioner"), "attacher": sidecar("csi-attacher"),
			"resizer": sidecar("csi-resizer"), "snapshotter": sidecar("csi-snapshotter")}},
		"snapshotController": map[string]any{"image": opts.SidecarImages["snapshot-controller"], "pullPolicy": "Never"},
		// No Pod network here (a null CNI): off the host network the CA
		// signer would reach nothing, the API server included.
		"caSigner": map[string]any{"hostNetwork": true},
		// The CSI controller Pod is on the host network and no kube-proxy
		// routes the Service: backup tools dial the sidecar's port on
		// loopback, where every node of this host listens.
		"snapshotMetadata": map[string]any{"image": opts.SidecarImages["csi-snapshot-metadata"],
			"address": fmt.Sprintf("127.0.0.1:%d", snapshotMetadataPort(opts.Values))},
	}
	for k, v := range opts.Values {
		values[k] = v
	}
	for _, name := range ChartSidecars {
		if opts.SidecarImages[name] == "" {
			return nil, fmt.Errorf("InstallChart: no image for %s", name)
		}
	}
	return json.MarshalIndent(values, "", "  ")
}

// snapshotMetadataPort is the sidecar's port the values set, or the chart's default.
func snapshotMetadataPort(values map[string]any) int {
	if ports, ok := values["ports"].(map[string]any); ok {
		if port, ok := ports["snapshotMetadata"].(int); ok {
			return port
		}
	}
	return ChartSnapshotMetadataPort
}

// prepareChartDirs makes the node's hostDir and disk directory shared
// mounts of themselves: the CSI node plugin mounts hostDir Bidirectional
// and the disks HostToContainer, which the container runtime refuses on a
// private mount (this host's / is one). The node's teardown unmounts them.
func (n *Node) prepareChartDirs() error {
	for _, dir := range []string{n.StrataDir(), filepath.Dir(n.DiskDir())} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		if slices.Contains(MountPoints(), dir) {
			continue
		}
		if err := syscall.Mount(dir, dir, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mounting %s onto itself: %w", dir, err)
		}
		if err := syscall.Mount("", dir, "", syscall.MS_SHARED|syscall.MS_REC, ""); err != nil {
			return fmt.Errorf("making %s a shared mount: %w", dir, err)
		}
	}
	return os.MkdirAll(n.DiskDir(), 0o700)
}
