package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/package/images"
)

const upTimeout = 5 * time.Minute // a cold image build is part of the first start

// `make run` leaves nothing on the host when stopped with Ctrl-C, and a run
// killed with -9 in the middle (its Pods running, their volumes mounted) is
// cleaned up by the next start in the same directory.
func TestLongRunLocalLeavesNothingBehind(t *testing.T) {
	root, err := localcluster.RepoRoot()
	require.NoError(t, err)
	binDir := t.TempDir()
	managerBin, err := localcluster.ManagerBinary(t.Context(), binDir)
	require.NoError(t, err)
	build := exec.Command("go", "build", "-o", filepath.Join(binDir, "run-local"), "./scripts/run-local")
	build.Dir = root
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build ./scripts/run-local: %s", out)
	// Not under t.TempDir(): its path, named after the test, is long for
	// the unix sockets inside.
	runDir, err := os.MkdirTemp("", "run-local-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(runDir) })
	baseline := localcluster.TakeHostBaseline()
	panicBefore := kernelPanicNotKubelets(t)

	// First run: a Pod is running when run-local is killed with -9.
	first := startRunLocal(t, binDir, managerBin, runDir)
	runPod(t, runDir, "before-crash")
	require.NoError(t, first.Process.Signal(syscall.SIGKILL))
	_ = first.Wait()
	require.NotEmpty(t, localcluster.HostResidue(runDir, baseline),
		"a run killed with -9 leaves its Pods (the point of the second run)")

	// Second run in the same directory: starts clean, then Ctrl-C.
	second := startRunLocal(t, binDir, managerBin, runDir)
	runPod(t, runDir, "before-ctrl-c")
	// The CSI controller plugin killed with -9 comes back with its sidecars,
	// as a kubelet would restart them: a new claim is still provisioned,
	// attached and mounted.
	killCSIController(t, runDir)
	runPod(t, runDir, "after-csi-kill")
	// The local S3 server answers as the default backup target.
	wait := exec.Command("kubectl", "--kubeconfig", filepath.Join(runDir, "admin.kubeconfig"), "-n", "strata-system",
		"wait", "--for=condition=Available", "backuptarget/default", "--timeout=60s")
	out, err = wait.CombinedOutput()
	require.NoError(t, err, "the default backup target is Available: %s", out)
	require.NoError(t, second.Process.Signal(syscall.SIGINT))
	done := make(chan error, 1)
	go func() { done <- second.Wait() }()
	select {
	case err := <-done:
		assert.NoError(t, err, "run-local exits cleanly on Ctrl-C")
	case <-time.After(2 * time.Minute):
		_ = second.Process.Kill()
		t.Fatal("run-local did not stop within 2 minutes of Ctrl-C")
	}
	assert.Empty(t, localcluster.HostResidue(runDir, baseline), "left on the host after Ctrl-C")
	after, err := os.ReadFile(kernelPanic)
	require.NoError(t, err)
	assert.Equal(t, panicBefore, string(after), "kernel.panic as it was before the first kubelet set it")
}

// kernelPanic is one of the sysctls kubelet sets (to 10) at start.
const kernelPanic = "/proc/sys/kernel/panic"

// kernelPanicNotKubelets makes sure kernel.panic differs from kubelet's
// value, so the test sees whether teardown puts it back; the machine's value
// is restored at the end.
func kernelPanicNotKubelets(t *testing.T) string {
	orig, err := os.ReadFile(kernelPanic)
	require.NoError(t, err)
	if strings.TrimSpace(string(orig)) != "10" {
		return string(orig)
	}
	require.NoError(t, os.WriteFile(kernelPanic, []byte("0\n"), 0o644))
	t.Cleanup(func() { _ = os.WriteFile(kernelPanic, orig, 0o644) })
	return "0\n"
}

// startRunLocal starts run-local with two nodes and waits until it says the
// cluster is up. The process is killed when the test ends, whatever happens.
func startRunLocal(t *testing.T, binDir, managerBin, runDir string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "run-local"), "--manager-bin", managerBin,
		"--run-dir", runDir, "--nodes", "2")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = cmd.Stdout // logrus writes to stderr
	require.NoError(t, cmd.Start())
	up, ended := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select { // t.Log must not run after the test
		case <-ended:
		case <-time.After(2 * time.Minute):
			_ = cmd.Process.Kill()
			<-ended
		}
		_ = localcluster.TeardownNodes(runDir, nil)
	})
	go func() {
		defer close(ended) // output ends when run-local exits
		sc := bufio.NewScanner(out)
		closed := false
		for sc.Scan() {
			t.Log(sc.Text())
			if !closed && strings.Contains(sc.Text(), "Press Ctrl-C to stop everything") {
				close(up)
				closed = true
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case <-up:
	case <-ended:
		t.Fatal("run-local exited before it was up (its output is above)")
	case <-time.After(upTimeout):
		t.Fatalf("run-local not up within %s", upTimeout)
	}
	return cmd
}

// runPod starts a Pod of the workload image with a PVC, as the printed
// example does, and waits until it runs.
func runPod(t *testing.T, runDir, name string) {
	t.Helper()
	kubeconfig := filepath.Join(runDir, "admin.kubeconfig")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kubectl := func(args ...string) string {
		cmd := exec.CommandContext(ctx, "kubectl", append([]string{"--kubeconfig", kubeconfig}, args...)...)
		b, err := cmd.CombinedOutput()
		require.NoError(t, err, "kubectl %s: %s", strings.Join(args, " "), b)
		return string(b)
	}
	// A Pod with a PVC, so the run has a volume staged and mounted through
	// nbdfuse and a loop device when it is stopped or killed.
	manifest := filepath.Join(t.TempDir(), "pod.yaml")
	require.NoError(t, os.WriteFile(manifest, []byte(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: `+name+`}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 16Mi}}}
---
apiVersion: v1
kind: Pod
metadata: {name: `+name+`}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{name: main, image: `+images.WorkloadRef+`, imagePullPolicy: Never,
                command: [sh, -c, 'echo hello | tee /data/hello; sleep 3600'],
                volumeMounts: [{name: data, mountPath: /data}]}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: `+name+`}}]
`), 0o644))
	kubectl("apply", "-f", manifest)
	kubectl("wait", "--for=condition=Ready", "pod/"+name, "--timeout=90s")
	assert.Equal(t, "hello", strings.TrimSpace(kubectl("logs", name)))
	assert.Equal(t, "hello", strings.TrimSpace(kubectl("exec", name, "--", "cat", "/data/hello")))
	_, err := os.Stat(kubeconfig)
	require.NoError(t, err)
}

// killCSIController kills run-local's CSI controller plugin with SIGKILL.
func killCSIController(t *testing.T, runDir string) {
	t.Helper()
	// The plugin runs in the strata-csi-controller Pod: its processes are
	// those in that Pod's cgroup (pod<uid>).
	uid, err := exec.Command("kubectl", "--kubeconfig", filepath.Join(runDir, "admin.kubeconfig"), "-n", "strata-system",
		"get", "pods", "-l", "app=strata-csi-controller", "-o", "jsonpath={.items[0].metadata.uid}").Output()
	require.NoError(t, err, "the CSI controller Pod of %s", runDir)
	podCgroup := "pod" + strings.TrimSpace(string(uid))
	out, err := exec.Command("pgrep", "-f", "csi --mode=controller").Output()
	require.NoError(t, err, "the controller plugin of %s runs", runDir)
	killed := 0
	for _, p := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(p)
		require.NoError(t, err)
		if cgroup, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid)); err == nil && strings.Contains(string(cgroup), podCgroup) {
			require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
			killed++
		}
	}
	require.Equal(t, 1, killed, "the controller plugin of %s's Pod", runDir)
}
