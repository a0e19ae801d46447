package e2e

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

const ns = types.DefaultNamespace

// createVolume creates a volume and removes it (and waits for it to go)
// when the test ends.
func createVolume(t *testing.T, name, size string, replicas int32, mut ...func(*v1beta1.Volume)) *v1beta1.Volume {
	t.Helper()
	v := &v1beta1.Volume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1beta1.VolumeSpec{Size: resource.MustParse(size), NumberOfReplicas: replicas,
			Frontend: v1beta1.VolumeFrontendNBD},
	}
	for _, m := range mut {
		m(v)
	}
	var created *v1beta1.Volume
	// The admission webhook may be between leaders for a moment.
	require.Eventually(t, func() bool {
		var err error
		created, err = env.adminStrata.StrataV1beta1().Volumes(ns).Create(context.Background(), v, metav1.CreateOptions{})
		if err != nil {
			t.Logf("create volume %s: %v", name, err)
		}
		return err == nil
	}, 30*time.Second, 500*time.Millisecond)
	t.Cleanup(func() {
		releaseWorkloadTickets(t, name)
		deleteVolume(t, name)
	})
	return created
}

// releaseWorkloadTickets removes the csi-attacher and strata-api tickets of
// a volume, which the webhook requires before the volume may be deleted.
func releaseWorkloadTickets(t *testing.T, volume string) {
	va, err := env.adminStrata.StrataV1beta1().VolumeAttachments(ns).Get(context.Background(), volume, metav1.GetOptions{})
	if err != nil {
		return
	}
	var ids []string
	for id, tk := range va.Spec.AttachmentTickets {
		if tk != nil && (tk.Type == v1beta1.AttacherTypeCSIAttacher || tk.Type == v1beta1.AttacherTypeStrataAPI) {
			ids = append(ids, id)
		}
	}
	if len(ids) > 0 {
		updateTickets(t, volume, removeTicket(ids...))
	}
}

func deleteVolume(t *testing.T, name string) {
	ctx := context.Background()
	err := env.adminStrata.StrataV1beta1().Volumes(ns).Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	require.NoError(t, err)
	waitVolumeGone(t, name)
}

// waitVolumeGone waits until the volume's CR is gone (its engine and
// replicas go first).
func waitVolumeGone(t *testing.T, name string) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, err := env.adminStrata.StrataV1beta1().Volumes(ns).Get(context.Background(), name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, time.Minute, 200*time.Millisecond, "volume %s is deleted with its engine and replicas", name)
}

func getVolume(t *testing.T, name string) *v1beta1.Volume {
	t.Helper()
	v, err := env.adminStrata.StrataV1beta1().Volumes(ns).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return v
}

// waitVolume waits until cond holds for the volume, and says what the
// volume looked like last when it does not.
func waitVolume(t *testing.T, name string, timeout time.Duration, what string, cond func(*v1beta1.Volume) bool) *v1beta1.Volume {
	t.Helper()
	var last *v1beta1.Volume
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		v, err := env.adminStrata.StrataV1beta1().Volumes(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			last = v
			if cond(v) {
				return v
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if last != nil {
		t.Fatalf("volume %s: %s: timed out after %s; spec.nodeID=%q status=%+v\n%s", name, what, timeout,
			last.Spec.NodeID, last.Status, describeChildren(name))
	}
	t.Fatalf("volume %s: %s: timed out after %s", name, what, timeout)
	return nil
}

func attachedTo(node string) func(*v1beta1.Volume) bool {
	return func(v *v1beta1.Volume) bool {
		return v.Status.State == v1beta1.VolumeStateAttached && v.Status.CurrentNodeID == node
	}
}

// servedOn is attachedTo with the frontend up: a volume attached for a
// restore or a clone (frontend off) is attached but serves nothing yet.
func servedOn(node string) func(*v1beta1.Volume) bool {
	return func(v *v1beta1.Volume) bool { return attachedTo(node)(v) && v.Status.FrontendEndpoint != "" }
}

func isDetached(v *v1beta1.Volume) bool {
	return v.Status.State == v1beta1.VolumeStateDetached && v.Status.CurrentNodeID == ""
}

// updateTickets edits a volume's VolumeAttachment tickets, retrying on conflicts.
func updateTickets(t *testing.T, volume string, edit func(map[string]*v1beta1.AttachmentTicket)) {
	t.Helper()
	ctx := context.Background()
	vas := env.adminStrata.StrataV1beta1().VolumeAttachments(ns)
	require.Eventually(t, func() bool {
		va, err := vas.Get(ctx, volume, metav1.GetOptions{})
		if err != nil {
			return false
		}
		if va.Spec.AttachmentTickets == nil {
			va.Spec.AttachmentTickets = map[string]*v1beta1.AttachmentTicket{}
		}
		edit(va.Spec.AttachmentTickets)
		_, err = vas.Update(ctx, va, metav1.UpdateOptions{})
		if err != nil && !apierrors.IsConflict(err) {
			t.Logf("update tickets of %s: %v", volume, err)
		}
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "tickets of %s updated", volume)
}

// useOn attaches a detached volume to node through an "admin" strata-api
// ticket, runs qemu-io commands on it, and detaches it again. It first
// waits for the volume to be detached: a snapshot's or a clone's
// attachment may still be going, and its endpoint (about to be removed)
// would pass for the admin's.
func useOn(t *testing.T, volume, node string, cmds ...string) {
	t.Helper()
	waitVolume(t, volume, time.Minute, "detached before use", isDetached)
	updateTickets(t, volume, addTicket("admin", v1beta1.AttacherTypeStrataAPI, node))
	v := waitVolume(t, volume, time.Minute, "served on "+node, servedOn(node))
	qemuIO(t, v.Status.FrontendEndpoint, cmds...)
	updateTickets(t, volume, removeTicket("admin"))
	waitVolume(t, volume, time.Minute, "detached", isDetached)
}

func addTicket(id string, typ v1beta1.AttacherType, node string) func(map[string]*v1beta1.AttachmentTicket) {
	return func(m map[string]*v1beta1.AttachmentTicket) {
		m[id] = &v1beta1.AttachmentTicket{ID: id, Type: typ, NodeID: node, Parameters: map[string]string{}}
	}
}

func removeTicket(ids ...string) func(map[string]*v1beta1.AttachmentTicket) {
	return func(m map[string]*v1beta1.AttachmentTicket) {
		for _, id := range ids {
			delete(m, id)
		}
	}
}

func getVA(t *testing.T, name string) *v1beta1.VolumeAttachment {
	t.Helper()
	va, err := env.adminStrata.StrataV1beta1().VolumeAttachments(ns).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return va
}

// qemuIO runs qemu-io commands against an NBD endpoint and fails the test
// with qemu-io's output when a command fails (a pattern mismatch included).
func qemuIO(t *testing.T, endpoint string, cmds ...string) string {
	t.Helper()
	out, err := runQemuIO(endpoint, cmds...)
	require.NoError(t, err, "qemu-io %v: %s", cmds, out)
	return out
}

func replicasOf(t *testing.T, volume string) []v1beta1.Replica {
	t.Helper()
	list, err := env.adminStrata.StrataV1beta1().Replicas(ns).List(context.Background(),
		metav1.ListOptions{LabelSelector: fmt.Sprintf("%s=%s", types.LabelVolume, volume)})
	require.NoError(t, err)
	return list.Items
}

func setSetting(t *testing.T, name types.SettingName, value string) (restore func()) {
	t.Helper()
	ctx := context.Background()
	s, err := env.adminStrata.StrataV1beta1().Settings(ns).Get(ctx, string(name), metav1.GetOptions{})
	require.NoError(t, err)
	old := s.Value
	require.NoError(t, setSettingValue(ctx, name, value))
	return func() { _ = setSettingValue(ctx, name, old) }
}

// setSettingValue sets a Setting's value, retrying on write conflicts.
func setSettingValue(ctx context.Context, name types.SettingName, value string) error {
	return retryOnConflict(func() error {
		s, err := env.adminStrata.StrataV1beta1().Settings(ns).Get(ctx, string(name), metav1.GetOptions{})
		if err != nil {
			return err
		}
		s.Value = value
		_, err = env.adminStrata.StrataV1beta1().Settings(ns).Update(ctx, s, metav1.UpdateOptions{})
		return err
	})
}

func runQemuIO(endpoint string, cmds ...string) (string, error) {
	args := []string{"-f", "raw"}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	out, err := exec.Command("qemu-io", append(args, endpoint)...).CombinedOutput()
	// qemu-io reports a failed command (a pattern mismatch included) on
	// its output and still exits 0.
	if err == nil && (strings.Contains(strings.ToLower(string(out)), "error") || strings.Contains(string(out), "Pattern verification failed")) {
		err = fmt.Errorf("qemu-io %v: %s", cmds, out)
	}
	return string(out), err
}

// describeChildren lists a volume's engines and replicas in a line each, to
// tell why a wait on the volume timed out.
func describeChildren(volume string) string {
	ctx := context.Background()
	sel := metav1.ListOptions{LabelSelector: types.LabelVolume + "=" + volume}
	var b strings.Builder
	if engines, err := env.adminStrata.StrataV1beta1().Engines(ns).List(ctx, sel); err == nil {
		for _, e := range engines.Items {
			fmt.Fprintf(&b, "engine %s node=%s desire=%s state=%s owner=%s modes=%v chain=%v\n", e.Name, e.Spec.NodeID,
				e.Spec.DesireState, e.Status.CurrentState, e.Status.OwnerID, e.Status.ReplicaModeMap,
				slices.Sorted(maps.Keys(e.Status.Snapshots)))
		}
	}
	if replicas, err := env.adminStrata.StrataV1beta1().Replicas(ns).List(ctx, sel); err == nil {
		for _, r := range replicas.Items {
			fmt.Fprintf(&b, "replica %s node=%s desire=%s state=%s owner=%s failedAt=%q healthyAt=%q\n", r.Name, r.Spec.NodeID,
				r.Spec.DesireState, r.Status.CurrentState, r.Status.OwnerID, r.Spec.FailedAt, r.Spec.HealthyAt)
		}
	}
	return b.String()
}
