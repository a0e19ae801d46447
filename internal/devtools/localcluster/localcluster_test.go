package localcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	systemNamespace = "strata-system"
	managerSA       = "strata-manager"
)

// TestLocalCluster starts one control plane and checks what Strata relies on:
// the shipped RBAC, manifest application, kubectl access, and the two
// kube-controller-manager controllers. It ends by stopping the cluster and
// checking that no child process is left.
func TestLongLocalCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	// Generous: the first run on a machine builds the binaries (minutes).
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	log := logrus.New()
	log.SetOutput(t.Output())

	dir := t.TempDir()
	start := time.Now()
	c, err := Start(ctx, Options{Dir: dir, Log: log})
	require.NoError(t, err)
	t.Logf("cluster started in %s", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range c.Processes() {
				t.Logf("--- tail of %s:\n%s", p.LogPath, p.LogTail(20))
			}
		}
		_ = c.Stop()
	})

	admin, err := kubernetes.NewForConfig(c.AdminConfig)
	require.NoError(t, err)

	// Install is given a copy of the real package/manifests and a test CRD in
	// place of k8s/crds: this test is about the local cluster, not about the
	// CRDs being written in k8s/, which have tests of their own.
	t.Run("install", func(t *testing.T) { testInstall(ctx, t, c) })
	t.Run("service account RBAC", func(t *testing.T) { testServiceAccountRBAC(ctx, t, c) })
	t.Run("token bound to a process node", func(t *testing.T) { testProcessNodeToken(ctx, t, c) })
	t.Run("apply manifests", func(t *testing.T) { testApplyManifests(ctx, t, c) })
	t.Run("kubectl with admin kubeconfig", func(t *testing.T) { testKubectl(ctx, t, c) })
	t.Run("ownerReference garbage collection", func(t *testing.T) { testGarbageCollection(ctx, t, admin) })
	t.Run("namespace deletion", func(t *testing.T) { testNamespaceDeletion(ctx, t, admin) })

	t.Run("stop leaves no process", func(t *testing.T) {
		procs := c.Processes()
		require.Len(t, procs, 4) // etcd, kube-apiserver, kube-controller-manager, kube-scheduler
		stopped := time.Now()
		require.NoError(t, c.Stop())
		t.Logf("cluster stopped in %s", time.Since(stopped).Round(time.Millisecond))
		for _, p := range procs {
			assert.ErrorIs(t, syscall.Kill(p.Pid(), 0), syscall.ESRCH, "%s (pid %d) still exists", p.Name, p.Pid())
			assert.ErrorIs(t, syscall.Kill(-p.Pid(), 0), syscall.ESRCH, "process group of %s still exists", p.Name)
		}
		assert.Empty(t, childProcesses(t), "children of the test process after Stop")
	})
}

// TestStartReportsEarlyExit uses stand-in binaries: an etcd that just waits
// and an API server that dies at once.
func TestStartReportsEarlyExit(t *testing.T) {
	tests := []struct {
		name         string
		apiserver    string // shell script body
		wantErr      string
		wantAttempts int
	}{
		{"port taken: retried with new ports", `echo "bind: address already in use" >&2; exit 1`, "address already in use", startAttempts},
		{"bad flag: fails at once", `echo "unknown flag: --nope" >&2; exit 2`, "unknown flag: --nope", 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bin, dir := t.TempDir(), t.TempDir()
			attempts := filepath.Join(dir, "attempts")
			writeFile(t, filepath.Join(bin, "etcd"), "#!/bin/sh\nexec sleep 600\n")
			writeFile(t, filepath.Join(bin, "kube-apiserver"), "#!/bin/sh\necho x >> "+attempts+"\n"+tc.apiserver+"\n")
			writeFile(t, filepath.Join(bin, "kube-controller-manager"), "#!/bin/sh\nexit 1\n")
			writeFile(t, filepath.Join(bin, "kube-scheduler"), "#!/bin/sh\nexit 1\n")
			for _, name := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
				require.NoError(t, os.Chmod(filepath.Join(bin, name), 0o755))
			}
			log := logrus.New()
			log.SetOutput(t.Output())

			_, err := Start(context.Background(), Options{Dir: dir, BinDir: bin, Log: log})
			require.Error(t, err)
			assert.Contains(t, err.Error(), "kube-apiserver exited early")
			assert.Contains(t, err.Error(), tc.wantErr, "the error carries the tail of the log")
			b, _ := os.ReadFile(attempts)
			assert.Equal(t, tc.wantAttempts, strings.Count(string(b), "x"))
			assert.Empty(t, childProcesses(t), "Start must stop what it started")
		})
	}
}

func testServiceAccountRBAC(ctx context.Context, t *testing.T, c *Cluster) {
	path := filepath.Join(t.TempDir(), "manager.kubeconfig")
	require.NoError(t, c.ServiceAccountKubeconfig(ctx, systemNamespace, managerSA, path))
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	require.NoError(t, err)
	sa, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)

	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "rbac-test"}}
	deployment := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "rbac-test"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "x"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "x"}}},
			},
		},
	}
	tests := []struct {
		name      string
		do        func(context.Context) error
		forbidden bool
	}{
		{"list leases in strata-system", func(ctx context.Context) error {
			_, err := sa.CoordinationV1().Leases(systemNamespace).List(ctx, metav1.ListOptions{})
			return err
		}, false},
		{"create lease in strata-system", func(ctx context.Context) error {
			_, err := sa.CoordinationV1().Leases(systemNamespace).Create(ctx, lease, metav1.CreateOptions{})
			return err
		}, false},
		{"list namespaces", func(ctx context.Context) error {
			_, err := sa.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
			return err
		}, false},
		{"list nodes", func(ctx context.Context) error {
			_, err := sa.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			return err
		}, false},
		{"list leases in default", func(ctx context.Context) error {
			_, err := sa.CoordinationV1().Leases(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
			return err
		}, true},
		{"list secrets in kube-system", func(ctx context.Context) error {
			_, err := sa.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{})
			return err
		}, true},
		{"create deployment in strata-system", func(ctx context.Context) error {
			_, err := sa.AppsV1().Deployments(systemNamespace).Create(ctx, deployment, metav1.CreateOptions{})
			return err
		}, true},
		{"delete namespace strata-system", func(ctx context.Context) error {
			return sa.CoreV1().Namespaces().Delete(ctx, systemNamespace, metav1.DeleteOptions{})
		}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do(ctx)
			if tc.forbidden {
				assert.Truef(t, apierrors.IsForbidden(err), "want Forbidden, got %v", err)
			} else {
				assert.NoError(t, err)
			}
		})
	}
}

// A process-mode manager's kubeconfig: the API server names its bare Node
// in the token's extra (what the CA signer checks), the Node is made once,
// and its token ends with it.
func testProcessNodeToken(ctx context.Context, t *testing.T, c *Cluster) {
	admin, err := kubernetes.NewForConfig(c.AdminConfig)
	require.NoError(t, err)
	kubeconfig := c.NodeKubeconfigs(systemNamespace, managerSA)
	path, err := kubeconfig("node-1")
	require.NoError(t, err)
	node, err := admin.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, IsProcessNode(node))
	again, err := kubeconfig("node-1")
	require.NoError(t, err)
	assert.Equal(t, path, again)
	same, err := admin.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, node.UID, same.UID, "a second token binds to the same Node")

	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	require.NoError(t, err)
	sa, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	review, err := sa.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	require.NoError(t, err)
	assert.Equal(t, "system:serviceaccount:"+systemNamespace+":"+managerSA, review.Status.UserInfo.Username)
	assert.Equal(t, authenticationv1.ExtraValue{"node-1"}, review.Status.UserInfo.Extra["authentication.kubernetes.io/node-name"])

	kubelets, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: KubeletNodeSelector})
	require.NoError(t, err)
	assert.Empty(t, kubelets.Items, "no kubelet runs here; the process Node is not one")

	require.NoError(t, c.DeleteProcessNodes(ctx))
	_, err = admin.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "deleted: %v", err)
	assert.Eventually(t, func() bool {
		_, err := sa.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		return apierrors.IsUnauthorized(err)
	}, 30*time.Second, 200*time.Millisecond, "the token ends with its Node")
}

func testInstall(ctx context.Context, t *testing.T, c *Cluster) {
	repo, err := RepoRoot()
	require.NoError(t, err)
	manifests, err := filepath.Glob(filepath.Join(repo, manifestsDir, "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, manifests)

	withoutCRDs, withCRDs := t.TempDir(), t.TempDir()
	for _, root := range []string{withoutCRDs, withCRDs} {
		for _, m := range manifests {
			copyFile(t, m, filepath.Join(root, manifestsDir, filepath.Base(m)))
		}
	}
	writeFile(t, filepath.Join(withCRDs, crdsDir, "test.strata.io_widgets.yaml"), testCRD("Widget"))

	tests := []struct {
		name    string
		root    string
		wantCRD bool
	}{
		{"no k8s/crds yet", withoutCRDs, false},
		{"with k8s/crds", withCRDs, true},
	}
	dyn, err := dynamic.NewForConfig(c.AdminConfig)
	require.NoError(t, err)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, c.Install(ctx, tc.root))
			_, err := dyn.Resource(crdResource).Get(ctx, "widgets.test.strata.io", metav1.GetOptions{})
			if tc.wantCRD {
				assert.NoError(t, err)
			} else {
				assert.True(t, apierrors.IsNotFound(err), "want NotFound, got %v", err)
			}
		})
	}
}

// testCRD is a minimal namespaced CRD in group test.strata.io, preceded by a
// comment-only document that must be skipped.
func testCRD(kind string) string {
	plural := strings.ToLower(kind) + "s"
	return fmt.Sprintf(`# comment only
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: %[2]s.test.strata.io
spec:
  group: test.strata.io
  scope: Namespaced
  names: {plural: %[2]s, singular: %[3]s, kind: %[1]s, listKind: %[1]sList}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          x-kubernetes-preserve-unknown-fields: true
`, kind, plural, strings.ToLower(kind))
}

func testCR(kind, name string) string {
	return fmt.Sprintf("apiVersion: test.strata.io/v1\nkind: %s\nmetadata:\n  name: %s\n  namespace: %s\nspec:\n  size: 3\n",
		kind, name, systemNamespace)
}

func writeFile(t *testing.T, path, content string) string {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
	return path
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	require.NoError(t, err)
	writeFile(t, to, string(b))
}

func testApplyManifests(ctx context.Context, t *testing.T, c *Cluster) {
	// The CR's file sorts before its CRD's: CRDs must be applied and
	// established first.
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "crs/00-gadget.yaml"), testCR("Gadget", "g1"))
	writeFile(t, filepath.Join(dir, "crs/10-crd.yaml"), testCRD("Gadget"))
	writeFile(t, filepath.Join(dir, "crs/README.md"), "not a manifest")
	noName := writeFile(t, filepath.Join(dir, "bad/no-name.yaml"), "apiVersion: v1\nkind: ConfigMap\n")
	noKind := writeFile(t, filepath.Join(dir, "bad/no-kind.yaml"), "apiVersion: test.strata.io/v1\nkind: Doohickey\nmetadata: {name: d}\n")

	tests := []struct {
		name    string
		paths   []string
		wantErr string
	}{
		{"CR before its CRD", []string{filepath.Join(dir, "crs")}, ""},
		{"applying again changes nothing", []string{filepath.Join(dir, "crs")}, ""},
		{"missing path", []string{filepath.Join(dir, "nope")}, "no such file"},
		{"document without a name", []string{noName}, "metadata.name"},
		{"kind nobody serves", []string{noKind}, "no API serves"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := c.ApplyManifests(ctx, tc.paths...)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
		})
	}

	dyn, err := dynamic.NewForConfig(c.AdminConfig)
	require.NoError(t, err)
	gvr := schema.GroupVersionResource{Group: "test.strata.io", Version: "v1", Resource: "gadgets"}
	w, err := dyn.Resource(gvr).Namespace(systemNamespace).Get(ctx, "g1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, int64(1), w.GetGeneration(), "a second apply of the same content must not change the object")
}

func testKubectl(ctx context.Context, t *testing.T, c *Cluster) {
	// Wherever it is installed (.ci/run links it into /usr/local/bin): a
	// missing kubectl is a broken test machine, not a reason to skip.
	kubectl, err := exec.LookPath("kubectl")
	require.NoError(t, err, "kubectl must be on PATH (.ci/run installs it)")
	out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", c.AdminKubeconfig,
		"get", "namespace", systemNamespace, "-o", "name").CombinedOutput()
	require.NoError(t, err, string(out))
	assert.Contains(t, string(out), "namespace/"+systemNamespace)
}

func testGarbageCollection(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	cms := cs.CoreV1().ConfigMaps(metav1.NamespaceDefault)
	owner, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gc-owner"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name: "gc-dependent",
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID,
		}},
	}}, metav1.CreateOptions{})
	require.NoError(t, err)

	background := metav1.DeletePropagationBackground
	require.NoError(t, cms.Delete(ctx, owner.Name, metav1.DeleteOptions{PropagationPolicy: &background}))
	start := time.Now()
	waitGone(ctx, t, func(ctx context.Context) error {
		_, err := cms.Get(ctx, "gc-dependent", metav1.GetOptions{})
		return err
	})
	t.Logf("dependent collected %s after its owner was deleted", time.Since(start).Round(time.Millisecond))
}

func testNamespaceDeletion(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns-deletion"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cs.CoreV1().ConfigMaps(ns.Name).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "content"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.NoError(t, cs.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}))
	waitGone(ctx, t, func(ctx context.Context) error {
		_, err := cs.CoreV1().Namespaces().Get(ctx, ns.Name, metav1.GetOptions{})
		return err
	})
}

// waitGone waits until get returns NotFound.
func waitGone(ctx context.Context, t *testing.T, get func(context.Context) error) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		last = get(ctx)
		return apierrors.IsNotFound(last), nil
	})
	require.NoError(t, err, "object still there (last get: %v)", last)
}

// childProcesses lists the pids whose parent is this test process.
func childProcesses(t *testing.T) []string {
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	self := strconv.Itoa(os.Getpid())
	var children []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		// "pid (comm) state ppid ...": comm may hold spaces, so split after ')'.
		s := string(stat)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[1] == self {
			children = append(children, e.Name()+" "+s[:strings.LastIndexByte(s, ')')+1])
		}
	}
	return children
}
