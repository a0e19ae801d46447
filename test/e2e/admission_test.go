package e2e

import (
	"context"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	stypes "github.com/strata-storage/strata/types"
)

// The admission tests' objects are named adm-*, apart from other tests'.

// kubectlIn runs kubectl with stdin and returns its combined output and
// error, for commands that are meant to fail.
func kubectlIn(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	path, err := exec.LookPath("kubectl")
	require.NoError(t, err, "kubectl must be installed")
	cmd := exec.Command(path, append([]string{"--kubeconfig", env.cluster.AdminKubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// A clone from a source that does not exist, or that is larger than the
// new volume, is refused through the API server with the field and the
// reason, and nothing is left behind.
func TestAdmissionCloneSourceChecked(t *testing.T) {
	t.Parallel() // reads, or objects of its own: runs beside the others at the end
	waitForWebhooks(t)
	ctx := context.Background()
	createVolume(t, "adm-src", "16Mi", 1)
	volumes := env.adminStrata.StrataV1beta1().Volumes(ns)
	clone := func(source, size string) error {
		v := &v1beta1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "adm-clone", Namespace: ns},
			Spec: v1beta1.VolumeSpec{Size: resource.MustParse(size), NumberOfReplicas: 1, DataSource: source}}
		created, err := volumes.Create(ctx, v, metav1.CreateOptions{})
		if err == nil {
			t.Cleanup(func() { deleteVolume(t, created.Name) })
		}
		return err
	}

	err := clone("snap://adm-src/adm-no-such-snap", "16Mi")
	require.Error(t, err)
	assert.True(t, apierrors.IsInvalid(err), "want Invalid, got %v", err)
	assert.Contains(t, err.Error(), `admission webhook "validator.strata.io" denied the request: `+
		`spec.dataSource: snapshot "adm-no-such-snap" of volume "adm-src" does not exist`)

	err = clone("vol://adm-src", "8Mi")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `spec.size: 8388608 bytes is smaller than the data source (volume adm-src has 16777216 bytes)`)

	_, err = volumes.Get(ctx, "adm-clone", metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "no clone was left behind: %v", err)
}

// Deleting a volume a workload holds attached is refused, naming the ticket
// and the command that removes it; once it is removed the delete goes
// through.
func TestAdmissionDeleteOfAttachedVolume(t *testing.T) {
	t.Parallel() // reads, or objects of its own: runs beside the others at the end
	waitForWebhooks(t)
	ctx := context.Background()
	createVolume(t, "adm-del", "16Mi", 1)
	waitVolume(t, "adm-del", time.Minute, "detached", isDetached)
	updateTickets(t, "adm-del", addTicket("me", v1beta1.AttacherTypeStrataAPI, "node-2"))
	waitVolume(t, "adm-del", time.Minute, "attached to node-2", attachedTo("node-2"))

	out, err := kubectlIn(t, "", "-n", ns, "delete", "vol", "adm-del", "--wait=false")
	require.Error(t, err, "the delete is refused: %s", out)
	assert.Contains(t, out, `Error from server (Conflict): admission webhook "validator.strata.io" denied the request: `+
		`volume adm-del is in use: VolumeAttachment adm-del holds workload ticket "me" (strata-api on node-2) `+
		`in spec.attachmentTickets; detach it before deleting the volume by removing the ticket: `+
		`kubectl -n strata-system patch va adm-del --type json -p '[{"op":"remove","path":"/spec/attachmentTickets/me"}]'`)
	v := getVolume(t, "adm-del")
	assert.Nil(t, v.DeletionTimestamp, "the volume is not being deleted")
	assert.True(t, attachedTo("node-2")(v), "and stays attached")

	// The command the message gives, as given.
	kubectl(t, "-n", ns, "patch", "va", "adm-del", "--type", "json", "-p",
		`[{"op":"remove","path":"/spec/attachmentTickets/me"}]`)
	// The webhook reads the attachment from a cache, which may lag a moment.
	require.Eventually(t, func() bool {
		err := env.adminStrata.StrataV1beta1().Volumes(ns).Delete(ctx, "adm-del", metav1.DeleteOptions{})
		if err != nil {
			t.Logf("delete adm-del: %v", err)
		}
		return err == nil || apierrors.IsNotFound(err)
	}, 10*time.Second, 200*time.Millisecond, "the delete goes through once the ticket is gone")
	require.Eventually(t, func() bool {
		_, err := env.adminStrata.StrataV1beta1().Volumes(ns).Get(ctx, "adm-del", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, time.Minute, 200*time.Millisecond, "the volume is deleted")
}

// System tickets do not hold a volume: a volume with only a snapshot
// controller's ticket can be deleted.
func TestAdmissionDeleteWithSystemTicket(t *testing.T) {
	t.Parallel() // reads, or objects of its own: runs beside the others at the end
	waitForWebhooks(t)
	createVolume(t, "adm-sys", "16Mi", 1)
	waitVolume(t, "adm-sys", time.Minute, "detached", isDetached)
	updateTickets(t, "adm-sys", addTicket("snap-x", v1beta1.AttacherTypeSnapshotController, "node-1"))
	deleteVolume(t, "adm-sys")
}

// kubectl get shows where an attachment stands and where a replica lives,
// and APPLIED false for a rejected setting.
func TestAdmissionPrinterColumns(t *testing.T) {
	waitForWebhooks(t)
	createVolume(t, "adm-cols", "16Mi", 1)
	waitVolume(t, "adm-cols", time.Minute, "detached", isDetached)
	updateTickets(t, "adm-cols", addTicket("me", v1beta1.AttacherTypeStrataAPI, "node-3"))
	updateTickets(t, "adm-cols", addTicket("snap-x", v1beta1.AttacherTypeSnapshotController, "node-1"))
	waitVolume(t, "adm-cols", time.Minute, "attached to node-3", attachedTo("node-3"))
	t.Cleanup(func() { updateTickets(t, "adm-cols", removeTicket("me", "snap-x")) })

	t.Run("get va: node, tickets, satisfied", func(t *testing.T) {
		header := regexp.MustCompile(`(?m)^NAME\s+VOLUME\s+NODE\s+TICKETS\s+SATISFIED\s+AGE$`)
		// One of two tickets is satisfied: the snapshot ticket asks for node-1.
		row := regexp.MustCompile(`(?m)^adm-cols\s+adm-cols\s+node-3\s+2\s+1\s+\S+$`)
		var out string
		require.Eventually(t, func() bool {
			out = kubectl(t, "-n", ns, "get", "va", "adm-cols")
			return header.MatchString(out) && row.MatchString(out)
		}, 30*time.Second, 200*time.Millisecond, "kubectl get va shows node, tickets and satisfied")
		t.Log(out)
	})
	t.Run("get rep: the disk's name, its UUID with -o wide", func(t *testing.T) {
		out := kubectl(t, "-n", ns, "get", "rep", "-l", stypes.LabelVolume+"=adm-cols")
		assert.Regexp(t, `(?m)^NAME\s+VOLUME\s+STATE\s+NODE\s+DISK\s+AGE$`, out)
		assert.Regexp(t, `(?m)^adm-cols-r-\S+\s+adm-cols\s+running\s+node-\d\s+disk-1\s+\S+$`, out)
		wide := kubectl(t, "-n", ns, "get", "rep", "-l", stypes.LabelVolume+"=adm-cols", "-o", "wide")
		assert.Regexp(t, `(?m)^adm-cols-r-\S+\s+adm-cols\s+running\s+node-\d\s+disk-1\s+[0-9a-f-]{36}\s+\S+$`, wide)
	})
	t.Run("get setting: APPLIED false for a rejected value", func(t *testing.T) {
		name := string(stypes.SettingBackingImageCleanupWaitInterval)
		defer setSetting(t, stypes.SettingBackingImageCleanupWaitInterval, "soon")()
		row := regexp.MustCompile(`(?m)^` + name + `\s+soon\s+false\s+\S+$`)
		var out string
		require.Eventually(t, func() bool {
			out = kubectl(t, "-n", ns, "get", "setting", name)
			return row.MatchString(out)
		}, 30*time.Second, 200*time.Millisecond, "kubectl get setting shows APPLIED false")
		t.Log(out)
	})
}

// Values the schema and webhooks fix or refuse, as an admin meets them.
func TestAdmissionValues(t *testing.T) {
	t.Parallel() // reads, or objects of its own: runs beside the others at the end
	waitForWebhooks(t)
	manifest := func(size string) string {
		return "apiVersion: strata.io/v1beta1\nkind: Volume\nmetadata: {name: adm-size, namespace: " + ns + "}\n" +
			"spec: {size: " + size + ", numberOfReplicas: 1}\n"
	}

	t.Run("size: abc is one clear error", func(t *testing.T) {
		out, err := kubectlIn(t, manifest("abc"), "create", "-f", "-")
		require.Error(t, err, out)
		assert.Contains(t, out, `spec.size: Invalid value: "abc": not a quantity such as 10Gi`)
		assert.NotContains(t, out, "evaluating rule", "no second, confusing rule failure")
		assert.Equal(t, 1, strings.Count(out, "Invalid value:"), "one error: %s", out)
	})
	t.Run("size: 1000 is stored as the 4096 the device serves", func(t *testing.T) {
		out, err := kubectlIn(t, manifest("1000"), "create", "--dry-run=server", "-f", "-", "-o", "jsonpath={.spec.size}")
		require.NoError(t, err, out)
		assert.Equal(t, "4096", out)
	})
	t.Run("disableFrontend: maybe is refused", func(t *testing.T) {
		createVolume(t, "adm-va", "16Mi", 1)
		require.Eventually(t, func() bool {
			_, err := env.adminStrata.StrataV1beta1().VolumeAttachments(ns).Get(context.Background(), "adm-va", metav1.GetOptions{})
			return err == nil
		}, 30*time.Second, 100*time.Millisecond, "the volume gets its VolumeAttachment")
		out, err := kubectlIn(t, "", "-n", ns, "patch", "va", "adm-va", "--type", "merge", "-p",
			`{"spec":{"attachmentTickets":{"me":{"id":"me","type":"strata-api","nodeID":"node-1","parameters":{"disableFrontend":"maybe"}}}}}`)
		require.Error(t, err, out)
		assert.Contains(t, out, `spec.attachmentTickets[me].parameters[disableFrontend]: must be "true", "false" or "any", got "maybe"`)
	})
	t.Run("kubectl explain states the bounds", func(t *testing.T) {
		assert.Contains(t, kubectl(t, "explain", "volume.spec.numberOfReplicas"), "Between 1 and 20.")
		assert.Contains(t, kubectl(t, "explain", "volume.spec.frontend"), `One of "nbd", "".`)
	})
}
