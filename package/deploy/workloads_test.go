package deploy

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/strata-storage/strata/app"
)

// pod is a rendered workload's Pod template, by workload name.
func pods(t *testing.T, objs []object) map[string]corev1.PodSpec {
	t.Helper()
	out := map[string]corev1.PodSpec{}
	for _, o := range objs {
		switch o.Kind {
		case "DaemonSet":
			var ds appsv1.DaemonSet
			o.decode(t, &ds)
			out[o.Name] = ds.Spec.Template.Spec
		case "Deployment":
			var d appsv1.Deployment
			o.decode(t, &d)
			out[o.Name] = d.Spec.Template.Spec
		}
	}
	return out
}

func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s", name)
	return corev1.Container{}
}

// flags are a strata-manager container's --name=value arguments after its
// subcommand (repeated flags keep every value).
func flags(t *testing.T, c corev1.Container) (string, map[string][]string) {
	t.Helper()
	require.NotEmpty(t, c.Args, c.Name)
	out := map[string][]string{}
	for _, a := range c.Args[1:] {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		require.True(t, ok && strings.HasPrefix(a, "--"), "%s: argument %q is not --name=value", c.Name, a)
		out[name] = append(out[name], value)
	}
	return c.Args[0], out
}

// unset are the flags of each Strata container the chart leaves to the
// binary's default (or to the component's `flags` value), and why. Every
// other flag must be set: a flag added to strata-manager fails this test
// until the chart sets it or it is listed here.
var unset = map[string]map[string]string{
	"strata-manager/manager": {
		"kubeconfig":                 "in-cluster credentials",
		"lease-duration":             "manager.flags",
		"disk-check-interval":        "manager.flags",
		"free-space-report-interval": "manager.flags",
		"workers":                    "manager.flags",
		"max-retry-delay":            "manager.flags",
		"api-advertise-address":      "--api-listen's address is the node's",
		"upload-size-limit":          "manager.flags",
		"webhook-url-host":           "local mode only: the chart uses the strata-webhook Service",
		"api-client-ca-configmap":    "the default (the API server's); api.clientCertificates=false empties it",
	},
	"strata-ca-signer/ca-signer": {
		"kubeconfig":       "in-cluster credentials",
		"lease-duration":   "caSigner.flags",
		"ca-rotate-before": "caSigner.flags",
	},
	"strata-instance-manager/instance-manager": {
		"nbd-listen":           "NBD over TCP is for one's own tools on the node's loopback",
		"backup-path":          "backupPaths (none by default)",
		"size-report-interval": "instanceManager.flags",
	},
	"strata-csi-node/csi-plugin": {
		"kubeconfig": "node mode makes no API call",
		"namespace":  "node mode makes no API call",
	},
	"strata-csi-controller/csi-plugin": {
		"node-name":                 "node mode only",
		"kubelet-root":              "node mode only",
		"state-dir":                 "node mode only",
		"daemon-cgroup-root":        "node mode only",
		"instance-manager-file-dir": "node mode only",
		"freeze-socket":             "node mode only",
		"kubeconfig":                "in-cluster credentials",
	},
}

// Every flag of each Strata container is known to its subcommand, every
// required one is given, every other is set or listed in unset, and every
// listener is bound to the node's own address: on the host network a
// default like :9500 would open the port on every interface.
func TestChartWiresEveryFlag(t *testing.T) {
	commands := map[string]*cli.Command{}
	for _, c := range app.NewCommand().Commands {
		commands[c.Name] = c
	}
	specs := pods(t, rendered(t))
	for key, skip := range unset {
		workload, name, _ := strings.Cut(key, "/")
		c := container(t, specs[workload], name)
		sub, given := flags(t, c)
		cmd := commands[sub]
		require.NotNil(t, cmd, "%s runs unknown subcommand %q", key, sub)
		known := map[string]bool{}
		for _, f := range cmd.Flags {
			n := f.Names()[0]
			known[n] = true
			_, isSet := given[n]
			_, isSkipped := skip[n]
			assert.True(t, isSet != isSkipped, "%s: --%s must be either set by the chart or listed in unset (set %v)", key, n, isSet)
			if r, ok := f.(cli.RequiredFlag); ok && r.IsRequired() {
				assert.True(t, isSet, "%s: required --%s not set", key, n)
			}
			if n == "listen" || strings.HasSuffix(n, "-listen") || n == "data-host" || n == "instance-manager-address" {
				if isSet {
					for _, v := range given[n] {
						assert.True(t, strings.HasPrefix(v, "$(HOST_IP)"), "%s: --%s=%s is not the node's address", key, n, v)
					}
				} else if d, ok := f.(cli.DocGenerationFlag); ok {
					assert.Empty(t, d.GetValue(), "%s: --%s left at its default %s listens", key, n, d.GetValue())
				}
			}
		}
		for n := range given {
			assert.True(t, known[n], "%s: strata-manager %s has no flag --%s", key, sub, n)
		}
		for n := range skip {
			assert.True(t, known[n], "%s: unset lists --%s, which strata-manager %s does not have", key, n, sub)
		}
		env := map[string]string{}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
				env[e.Name] = e.ValueFrom.FieldRef.FieldPath
			}
		}
		if workload == "strata-ca-signer" {
			// Not a node's component: its Lease holder is the Pod.
			assert.Equal(t, "metadata.name", env["POD_NAME"], key)
			assert.Equal(t, "metadata.namespace", env["POD_NAMESPACE"], key)
			assert.Equal(t, []string{"$(POD_NAME)"}, given["identity"], key)
			continue
		}
		assert.Equal(t, "status.hostIP", env["HOST_IP"], key)
		assert.Equal(t, "spec.nodeName", env["NODE_NAME"], key)
	}
}

// What each Pod may do on its node: privileged only for the CSI node
// plugin and, serving volumes as FUSE files (instanceManager.fuseFiles,
// the default), the instance manager; the runtime's default seccomp
// profile for every Pod, and a user that is not root for those that touch
// no host directory; a read-only root filesystem everywhere; the host
// network for the Pods that listen or reach the API server, but the CA
// signer's (caSigner.hostNetwork); requests everywhere; the update
// strategies.
func TestChartPodsBehaveOnANode(t *testing.T) {
	objs := rendered(t)
	specs := pods(t, objs)
	require.ElementsMatch(t, []string{"strata-manager", "strata-instance-manager", "strata-csi-node",
		"strata-csi-controller", "strata-ca-signer", "snapshot-controller"}, keys(specs))
	// Why the others run as root (with no capability): their data and
	// state are root's files in host directories (README "What runs").
	nonRoot := []string{"strata-csi-controller", "strata-ca-signer", "snapshot-controller"}
	for name, spec := range specs {
		psc := spec.SecurityContext
		require.NotNil(t, psc, "%s has no Pod securityContext", name)
		require.NotNil(t, psc.SeccompProfile, name)
		assert.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, psc.SeccompProfile.Type, name)
		if slices.Contains(nonRoot, name) {
			assert.True(t, *psc.RunAsNonRoot, name)
			assert.NotZero(t, *psc.RunAsUser, name)
			assert.NotZero(t, *psc.RunAsGroup, name)
			for _, v := range spec.Volumes {
				assert.Nil(t, v.HostPath, "%s: a host directory in a Pod that runs as non-root", name)
			}
		}
		for _, c := range spec.Containers {
			sc := c.SecurityContext
			require.NotNil(t, sc, "%s/%s has no securityContext", name, c.Name)
			assert.True(t, sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem, "%s/%s: read-only root filesystem", name, c.Name)
			privileged := sc.Privileged != nil && *sc.Privileged
			assert.Equal(t, name == "strata-csi-node" || name == "strata-instance-manager", privileged, "%s/%s privileged", name, c.Name)
			if !privileged {
				assert.Equal(t, false, *sc.AllowPrivilegeEscalation, "%s/%s", name, c.Name)
				assert.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop, "%s/%s", name, c.Name)
				assert.Empty(t, sc.Capabilities.Add, "%s/%s", name, c.Name)
			}
			assert.False(t, c.Resources.Requests.Cpu().IsZero(), "%s/%s: no CPU request", name, c.Name)
			assert.False(t, c.Resources.Requests.Memory().IsZero(), "%s/%s: no memory request", name, c.Name)
			for _, m := range c.VolumeMounts {
				if m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional {
					assert.True(t, privileged, "%s/%s: Bidirectional needs privileged", name, c.Name)
				}
			}
		}
		assert.Equal(t, name != "strata-csi-node" && name != "strata-ca-signer", spec.HostNetwork, "%s hostNetwork", name)
	}
	for _, name := range []string{"strata-manager", "strata-instance-manager", "strata-csi-node"} {
		assert.Equal(t, "system-node-critical", specs[name].PriorityClassName, name)
	}
	assert.True(t, specs["strata-csi-node"].HostPID, "nbdfuse must outlive the CSI node container")
	requireFUSEFilesShared(t, specs)

	var im, mgr appsv1.DaemonSet
	find(t, objs, "DaemonSet", "strata-instance-manager").decode(t, &im)
	find(t, objs, "DaemonSet", "strata-manager").decode(t, &mgr)
	assert.Equal(t, appsv1.OnDeleteDaemonSetStrategyType, im.Spec.UpdateStrategy.Type)
	assert.Equal(t, appsv1.RollingUpdateDaemonSetStrategyType, mgr.Spec.UpdateStrategy.Type)
	assert.Equal(t, intstr.FromInt32(1), *mgr.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable)

	// The CA signer: one Pod at a time, under its own identity, with no
	// volume at all (the CA key is read from the API only).
	var signer appsv1.Deployment
	find(t, objs, "Deployment", "strata-ca-signer").decode(t, &signer)
	assert.Equal(t, int32(1), *signer.Spec.Replicas)
	assert.Equal(t, appsv1.RecreateDeploymentStrategyType, signer.Spec.Strategy.Type)
	assert.Equal(t, "strata-signer", specs["strata-ca-signer"].ServiceAccountName)
	assert.Empty(t, specs["strata-ca-signer"].Volumes)
	for name, spec := range specs {
		assert.Equal(t, name == "strata-ca-signer", spec.ServiceAccountName == "strata-signer", "%s runs as %s", name, spec.ServiceAccountName)
	}

	// The manager's probes are on its metrics listener.
	m := container(t, specs["strata-manager"], "manager")
	_, mf := flags(t, m)
	port := m.Ports[slices.IndexFunc(m.Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" })]
	assert.Equal(t, []string{fmt.Sprintf("$(HOST_IP):%d", port.ContainerPort)}, mf["metrics-listen"])
	require.NotNil(t, m.LivenessProbe)
	require.NotNil(t, m.ReadinessProbe)
	assert.Equal(t, "/healthz", m.LivenessProbe.HTTPGet.Path)
	assert.Equal(t, "/readyz", m.ReadinessProbe.HTTPGet.Path)
	assert.Equal(t, intstr.FromString("metrics"), m.ReadinessProbe.HTTPGet.Port)
}

// The host directories the components share are the same on both sides:
// the TLS directory (manager writes, instance manager reads), the NBD
// socket (instance manager serves, CSI node plugin dials) and the kubelet's
// directory (the plugin's sockets, published volumes).
func TestChartSharedHostDirectories(t *testing.T) {
	specs := pods(t, rendered(t))
	_, mf := flags(t, container(t, specs["strata-manager"], "manager"))
	_, imf := flags(t, container(t, specs["strata-instance-manager"], "instance-manager"))
	_, nf := flags(t, container(t, specs["strata-csi-node"], "csi-plugin"))
	assert.Equal(t, mf["instance-manager-tls-dir"], imf["tls-dir"])

	tls := imf["tls-dir"][0]
	mm := hostMount(t, specs["strata-manager"], "manager", tls)
	imm := hostMount(t, specs["strata-instance-manager"], "instance-manager", tls)
	assert.Equal(t, mm.host, imm.host, "one TLS directory")
	assert.False(t, mm.readOnly)
	assert.True(t, imm.readOnly, "the instance manager only reads its certificates")

	socket := imf["nbd-socket"][0]
	a := hostMount(t, specs["strata-instance-manager"], "instance-manager", socket)
	b := hostMount(t, specs["strata-csi-node"], "csi-plugin", socket)
	assert.Equal(t, a.host, b.host, "the NBD socket's directory")
	assert.Equal(t, a.path, a.host, "endpoints name the socket by its host path")
	assert.Equal(t, b.path, b.host)

	kubelet := hostMount(t, specs["strata-csi-node"], "csi-plugin", nf["csi-address"][0])
	assert.Equal(t, nf["kubelet-root"][0], kubelet.path)
	assert.Equal(t, kubelet.path, kubelet.host, "the kubelet dials the CSI socket by its host path")
	assert.Equal(t, corev1.MountPropagationBidirectional, kubelet.propagation)
	state := hostMount(t, specs["strata-csi-node"], "csi-plugin", nf["state-dir"][0])
	assert.Equal(t, corev1.MountPropagationBidirectional, state.propagation, "FUSE mounts outlive the container")

	for _, d := range imf["disk-path"] {
		assert.Equal(t, d, hostMount(t, specs["strata-instance-manager"], "instance-manager", d).host)
	}
	assert.Equal(t, mf["disk"], imf["disk-path"], "the manager's disks are the instance manager's")
}

// Values that change the workloads: per-node disks get DaemonSets of their
// own (the other nodes keep the default set), and the switches do what
// they say.
func TestChartOptions(t *testing.T) {
	helm := helmBinary(t)
	objs := parseObjects(t, renderChart(t, helm, "disks.perNode.worker-3={/mnt/a,fast=/mnt/b}",
		"backupPaths={/mnt/nfs}", "dataEncryption=false", "snapshotCRDs.install=false", "snapshotController.enabled=false"))
	specs := pods(t, objs)
	for _, prefix := range []string{"strata-manager", "strata-instance-manager"} {
		def, own := specs[prefix], specs[prefix+"-worker-3"]
		require.NotNil(t, own.Containers, "no %s-worker-3", prefix)
		terms := func(s corev1.PodSpec) string {
			b, err := json.Marshal(s.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms)
			require.NoError(t, err)
			return string(b)
		}
		assert.JSONEq(t, `[{"matchFields":[{"key":"metadata.name","operator":"NotIn","values":["worker-3"]}]}]`, terms(def))
		assert.JSONEq(t, `[{"matchFields":[{"key":"metadata.name","operator":"In","values":["worker-3"]}]}]`, terms(own))
	}
	_, mf := flags(t, container(t, specs["strata-manager-worker-3"], "manager"))
	assert.Equal(t, []string{"/mnt/a", "fast=/mnt/b"}, mf["disk"])
	_, imf := flags(t, container(t, specs["strata-instance-manager-worker-3"], "instance-manager"))
	assert.Equal(t, []string{"/mnt/a", "/mnt/b"}, imf["disk-path"])
	assert.Equal(t, []string{"/mnt/nfs"}, imf["backup-path"])
	assert.Equal(t, []string{"false"}, imf["data-encryption"])
	hostMount(t, specs["strata-manager-worker-3"], "manager", "/mnt/b")
	hostMount(t, specs["strata-manager"], "manager", "/mnt/nfs")
	assert.NotContains(t, specs, "snapshot-controller")
	for _, o := range objs {
		assert.NotContains(t, o.Name, "snapshot.storage.k8s.io", "snapshotCRDs.install=false still renders %s", o.key())
	}
}

type mount struct {
	path, host  string
	readOnly    bool
	propagation corev1.MountPropagationMode
}

// hostMount is the hostPath mount of a container that holds path.
func hostMount(t *testing.T, spec corev1.PodSpec, name, path string) mount {
	t.Helper()
	c := container(t, spec, name)
	best := mount{}
	for _, m := range c.VolumeMounts {
		if path != m.MountPath && !strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.HostPath != nil && len(m.MountPath) > len(best.path) {
				best = mount{path: m.MountPath, host: v.HostPath.Path, readOnly: m.ReadOnly}
				if m.MountPropagation != nil {
					best.propagation = *m.MountPropagation
				}
			}
		}
	}
	require.NotEmpty(t, best.path, "%s: no host directory holds %s", name, path)
	return best
}

// The objects package/manifests and package/csi also ship say the same:
// the webhook Service and configurations, the CSIDriver, StorageClass and
// VolumeSnapshotClass.
// Every namespaced object names its namespace (kubectl apply would put it
// in the current one).
func TestChartMatchesShippedObjects(t *testing.T) {
	objs := rendered(t)
	root := repoRoot(t)
	shipped := slices.Concat(readObjects(t, filepath.Join(root, "package", "manifests", "20-webhook-service.yaml")),
		readObjects(t, filepath.Join(root, "package", "manifests", "21-webhook-configurations.yaml")),
		readObjects(t, filepath.Join(root, "package", "csi", "*.yaml")))
	for _, want := range shipped {
		got := find(t, objs, want.Kind, want.Name)
		assert.Equal(t, want.Namespace, got.Namespace, want.key())
		assert.Equal(t, want.Annotations, got.Annotations, want.key())
		assert.JSONEq(t, withoutMetadata(t, want.json), withoutMetadata(t, got.json), want.key())
	}
	clusterScoped := []string{"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
		"CSIDriver", "StorageClass", "VolumeSnapshotClass", "VolumeGroupSnapshotClass",
		"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"}
	for _, o := range objs {
		if !slices.Contains(clusterScoped, o.Kind) {
			assert.NotEmpty(t, o.Namespace, "%s has no namespace", o.key())
		}
	}
}

func withoutMetadata(t *testing.T, j []byte) string {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(j, &m))
	delete(m, "metadata")
	out, err := json.Marshal(m)
	require.NoError(t, err)
	return string(out)
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// The instance manager's files reach the host (Bidirectional) and the CSI
// node plugin (HostToContainer) at the path both are told; without
// instanceManager.fuseFiles the instance manager is unprivileged and the
// plugin is told of no files.
func requireFUSEFilesShared(t *testing.T, specs map[string]corev1.PodSpec) {
	t.Helper()
	im, plugin := container(t, specs["strata-instance-manager"], "instance-manager"), container(t, specs["strata-csi-node"], "csi-plugin")
	_, imFlags := flags(t, im)
	_, pluginFlags := flags(t, plugin)
	require.Len(t, imFlags["fuse-dir"], 1)
	dir := imFlags["fuse-dir"][0]
	assert.Equal(t, []string{dir}, pluginFlags["instance-manager-file-dir"])
	propagation := func(c corev1.Container) corev1.MountPropagationMode {
		for _, m := range c.VolumeMounts {
			if m.MountPath == dir && m.MountPropagation != nil {
				return *m.MountPropagation
			}
		}
		return ""
	}
	assert.Equal(t, corev1.MountPropagationBidirectional, propagation(im))
	assert.Equal(t, corev1.MountPropagationHostToContainer, propagation(plugin))

	off := pods(t, parseObjects(t, renderChart(t, helmBinary(t), "instanceManager.fuseFiles=false")))
	im, plugin = container(t, off["strata-instance-manager"], "instance-manager"), container(t, off["strata-csi-node"], "csi-plugin")
	assert.False(t, *im.SecurityContext.Privileged)
	assert.Equal(t, []corev1.Capability{"ALL"}, im.SecurityContext.Capabilities.Drop)
	_, imFlags = flags(t, im)
	_, pluginFlags = flags(t, plugin)
	assert.NotContains(t, imFlags, "fuse-dir")
	assert.NotContains(t, pluginFlags, "instance-manager-file-dir")
}
