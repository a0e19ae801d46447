package localcluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/strata-storage/strata/package/images"
)

// containerdConfig is containerd 2's configuration for this node. Every
// path containerd, its shims and runc write to is under the node directory
// (the shims' own sockets excepted: containerd puts those in
// /run/containerd/s whatever the config says, and teardown removes them).
// The settings the facts of these machines require:
//   - cgroup v1 without systemd: the cgroupfs driver (SystemdCgroup = false);
//   - no CAP_SYS_RESOURCE: restrict_oom_score_adj, else runc fails every sandbox;
//   - no AppArmor; a null CNI so Pods without host networking start too.
func (n *Node) containerdConfig() string {
	runc, err := exec.LookPath("runc")
	if err != nil {
		runc = "/usr/sbin/runc"
	}
	d := n.path("containerd")
	return fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q
# NRI would listen on /var/run/nri, shared by every node on the machine.
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q

[plugins.'io.containerd.internal.v1.opt']
  path = %[5]q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[6]q

[plugins.'io.containerd.cri.v1.runtime']
  disable_apparmor = true
  restrict_oom_score_adj = true
  # Pod network namespaces are mounted here, not in the shared /var/run/netns.
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %[7]q
        Root = %[8]q
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%[9]q]
    conf_dir = %[10]q

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
`, filepath.Join(d, "root"), filepath.Join(d, "state"), n.ContainerdSocket(), n.ContainerdSocket()+".ttrpc",
		filepath.Join(d, "opt"), images.PauseRef, runc, n.path("runc"), n.path("cni-bin"), n.path("cni-conf"))
}

// nullCNIPlugin wires nothing: a Pod without host networking keeps its own
// network namespace with only lo. It reports an eth0 with a loopback address
// because containerd wants an address for the sandbox. Strata's own Pods use
// the host network; test Pods need no network.
const nullCNIPlugin = `#!/bin/sh
cat >/dev/null
case "$CNI_COMMAND" in
  VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0"]}' ;;
  ADD) printf '{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"%s"}],"ips":[{"address":"127.0.0.1/32","interface":0}]}\n' "$CNI_NETNS" ;;
  *) : ;;
esac
`

const nullCNIConfig = `{
  "cniVersion": "1.0.0",
  "name": "strata-null",
  "plugins": [ { "type": "strata-null" } ]
}
`

// cniLoopbackPlugin is the standard plugin containerd runs to bring lo up in
// every Pod's namespace (Debian: containernetworking-plugins).
const cniLoopbackPlugin = "/usr/lib/cni/loopback"

func (n *Node) writeCNI() error {
	if _, err := os.Stat(cniLoopbackPlugin); err != nil {
		return fmt.Errorf("CNI loopback plugin: %w (apt-get install containernetworking-plugins)", err)
	}
	loopback := n.path("cni-bin", "loopback")
	_ = os.Remove(loopback)
	if err := os.Symlink(cniLoopbackPlugin, loopback); err != nil {
		return err
	}
	if err := os.WriteFile(n.path("cni-bin", "strata-null"), []byte(nullCNIPlugin), 0o755); err != nil {
		return err
	}
	return os.WriteFile(n.path("cni-conf", "10-strata-null.conflist"), []byte(nullCNIConfig), 0o644)
}

// kubeletConfig is the node's KubeletConfiguration. Beside the paths and
// ports that keep several kubelets on one machine apart, it holds what these
// machines need: cgroup v1 accepted, the cgroupfs driver, no swap check, and
// eviction thresholds low enough that a busy test machine never evicts.
func (n *Node) kubeletConfig() ([]byte, error) {
	cfg := kubeletv1beta1.KubeletConfiguration{
		TypeMeta:                    metav1.TypeMeta{APIVersion: "kubelet.config.k8s.io/v1beta1", Kind: "KubeletConfiguration"},
		Address:                     n.Name,
		Port:                        int32(n.KubeletPort),
		ReadOnlyPort:                0,
		HealthzBindAddress:          "127.0.0.1",
		HealthzPort:                 ptr.To(int32(n.healthPort)),
		FailCgroupV1:                ptr.To(false),
		FailSwapOn:                  ptr.To(false),
		CgroupDriver:                "cgroupfs",
		CgroupRoot:                  n.cgroupRoot,
		CgroupsPerQOS:               ptr.To(true),
		EnforceNodeAllocatable:      []string{"pods"},
		ContainerRuntimeEndpoint:    "unix://" + n.ContainerdSocket(),
		StaticPodPath:               n.path("static-pods"),
		PodLogsDir:                  n.path("pod-logs"),
		VolumePluginDir:             n.path("volume-plugins"),
		TLSCertFile:                 n.path("pki", "kubelet.crt"),
		TLSPrivateKeyFile:           n.path("pki", "kubelet.key"),
		Authentication:              kubeletv1beta1.KubeletAuthentication{Anonymous: kubeletv1beta1.KubeletAnonymousAuthentication{Enabled: ptr.To(false)}, Webhook: kubeletv1beta1.KubeletWebhookAuthentication{Enabled: ptr.To(true)}, X509: kubeletv1beta1.KubeletX509Authentication{ClientCAFile: n.path("pki", "ca.crt")}},
		Authorization:               kubeletv1beta1.KubeletAuthorization{Mode: kubeletv1beta1.KubeletAuthorizationModeWebhook},
		ClusterDomain:               "cluster.local",
		ResolverConfig:              ptr.To(""),
		EvictionHard:                map[string]string{"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
		ImageGCHighThresholdPercent: ptr.To(int32(100)), // images come from no registry: never collect them
		ImageGCLowThresholdPercent:  ptr.To(int32(99)),
		ProtectKernelDefaults:       false,
		MakeIPTablesUtilChains:      ptr.To(false),
		SerializeImagePulls:         ptr.To(false),
		RegisterNode:                ptr.To(true),
		NodeStatusReportFrequency:   metav1.Duration{Duration: time.Minute},
		// The kubelet verifies a CSI volume's attachment only once its node
		// status has reported the volume in use, and it computes that status
		// every NodeStatusUpdateFrequency (default 10 s): a Pod on a new
		// claim waited 0–10 s for it here (docs/bench-pod-start.md). It
		// posts the status only when it changed or NodeStatusReportFrequency
		// passed, so a shorter period costs no API writes on an idle node.
		NodeStatusUpdateFrequency: metav1.Duration{Duration: time.Second},
		SyncFrequency:             metav1.Duration{Duration: 10 * time.Second}, // configmap/secret volumes refresh sooner
	}
	return yaml.Marshal(cfg)
}

// makeCgroupRoot creates the node's own cgroup in every cgroup v1 hierarchy,
// as kubelet insists that its cgroup root exists. A new cpuset cgroup starts
// with no CPUs and no memory nodes, so it gets its parent's.
func (n *Node) makeCgroupRoot() error {
	hierarchies, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	for _, h := range hierarchies {
		dir := filepath.Join(h, n.cgroupRoot)
		if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
			return fmt.Errorf("cgroup %s: %w", dir, err)
		}
		if filepath.Base(h) != "cpuset" {
			continue
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			v, err := os.ReadFile(filepath.Join(h, f))
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
				return fmt.Errorf("cgroup %s/%s: %w", dir, f, err)
			}
		}
	}
	return nil
}

// cgroupHierarchies lists the mounted cgroup hierarchies (v1 controllers and
// named ones) under /sys/fs/cgroup.
func cgroupHierarchies() ([]string, error) {
	entries, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		h := filepath.Join("/sys/fs/cgroup", e.Name())
		if fi, err := os.Lstat(h); err != nil || !fi.IsDir() { // cpu,cpuacct links to the real one
			continue
		}
		if _, err := os.Stat(filepath.Join(h, "cgroup.procs")); err == nil {
			out = append(out, h)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no cgroup hierarchy under /sys/fs/cgroup (%s)", strings.Join(entryNames(entries), ", "))
	}
	return out, nil
}

func entryNames(entries []os.DirEntry) []string {
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names
}
