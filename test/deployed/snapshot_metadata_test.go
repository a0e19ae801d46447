package deployed

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubernetes-csi/external-snapshot-metadata/pkg/api"
	"github.com/kubernetes-csi/external-snapshot-metadata/pkg/iterator"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/types"
)

// Changed-block tracking as a backup tool gets it, through the upstream
// external-snapshot-metadata sidecar in the CSI controller Pod. The client
// is upstream's own library for backup tools (pkg/iterator): it looks up
// the SnapshotMetadataService named after the driver, asks the API server
// for a token of the tool's ServiceAccount for the CR's audience, dials the
// CR's address trusting the CR's CA, and streams the answer.

// blockCollector is an iterator emitter that keeps what it is sent.
type blockCollector struct {
	records  int
	extents  [][2]int64
	capacity int64
	bytes    int // the messages' encoded size
}

func (c *blockCollector) SnapshotMetadataIteratorRecord(_ int, md iterator.IteratorMetadata) error {
	c.records++
	c.capacity = md.VolumeCapacityBytes
	for _, b := range md.BlockMetadata {
		c.extents = append(c.extents, [2]int64{b.ByteOffset, b.SizeBytes})
	}
	c.bytes += proto.Size(&api.GetMetadataDeltaResponse{BlockMetadataType: md.BlockMetadataType,
		VolumeCapacityBytes: md.VolumeCapacityBytes, BlockMetadata: md.BlockMetadata})
	return nil
}

func (c *blockCollector) SnapshotMetadataIteratorDone(int) error { return nil }

// backupTool is a ServiceAccount that may get VolumeSnapshots in
// podNamespace, as a backup tool's would.
func backupTool(t *testing.T, name string) {
	t.Helper()
	role := name + "-snapshot-reader"
	kubectl(t, "create", "clusterrole", role, "--verb=get", "--resource=volumesnapshots.snapshot.storage.k8s.io")
	t.Cleanup(func() { _, _ = kubectlOut(context.Background(), "delete", "clusterrole", role) })
	serviceAccountToken(t, name, role, podNamespace)
}

// snapshotBlocks asks through the sidecar: the allocated blocks of
// snapshot, or with base the blocks written between them.
func snapshotBlocks(t *testing.T, tool, snapshot, base string, maxResults int32) *blockCollector {
	t.Helper()
	clients, err := iterator.BuildClients(env.cluster.AdminConfig)
	require.NoError(t, err)
	got := &blockCollector{}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, iterator.GetSnapshotMetadata(ctx, iterator.Args{Clients: clients, Emitter: got,
		Namespace: podNamespace, SnapshotName: snapshot, PrevSnapshotName: base, MaxResults: maxResults,
		SANamespace: podNamespace, SAName: tool}), "snapshot %s, base %q", snapshot, base)
	return got
}

// The chart's wiring and exact answers: a Pod writes a block claim at
// known offsets around two VolumeSnapshots; the allocated answer of the
// first and the delta between them list exactly those blocks, paged as
// asked. A token for another audience is refused, and so is a tool that
// may not get the snapshots.
func testSnapshotMetadataThroughTheSidecar(t *testing.T) {
	logsOnFailure(t)
	ctx := context.Background()
	sms, err := iterator.BuildClients(env.cluster.AdminConfig)
	require.NoError(t, err)
	cr, err := sms.SmsCRClient.CbtV1beta1().SnapshotMetadataServices().Get(ctx, types.CSIDriverName, metav1.GetOptions{})
	require.NoError(t, err, "the CA signer publishes the SnapshotMetadataService")
	assert.Equal(t, "strata-snapshot-metadata", cr.Spec.Audience)
	assert.Equal(t, fmt.Sprintf("127.0.0.1:%d", env.chart.Values["ports"].(map[string]any)["snapshotMetadata"]), cr.Spec.Address)

	backupTool(t, "cbt-backup")
	claimIn(t, podNamespace, "cbt-md", "16Mi", "volumeMode: Block")
	podIn(t, podNamespace, "cbt-md-1", "127.0.0.2", "cbt-md", "exec sleep 3600", true)
	writeAroundTwoSnapshots(t, "cbt-md-1", func(name string) {
		require.NoError(t, takeVolumeSnapshot(t, podNamespace, name, "cbt-md"))
		waitVolumeSnapshotReady(t, podNamespace, name)
	}, "cbt-md-s1", "cbt-md-s2")

	allocated := snapshotBlocks(t, "cbt-backup", "cbt-md-s1", "", 0)
	assert.Equal(t, blocksOfTheFirst, allocated.extents, "the blocks of cbt-md-s1")
	assert.EqualValues(t, 16<<20, allocated.capacity)
	delta := snapshotBlocks(t, "cbt-backup", "cbt-md-s2", "cbt-md-s1", 0)
	assert.Equal(t, blocksBetween, delta.extents, "written between s1 and s2")
	paged := snapshotBlocks(t, "cbt-backup", "cbt-md-s2", "cbt-md-s1", 1)
	assert.Equal(t, delta.extents, paged.extents, "one extent per message")
	assert.Equal(t, 2, paged.records)

	// Refusals, straight on the sidecar's gRPC API.
	client := sidecarClient(t, cr.Spec.Address, cr.Spec.CACert)
	ask := func(token string) error {
		stream, err := client.GetMetadataAllocated(ctx, &api.GetMetadataAllocatedRequest{SecurityToken: token,
			Namespace: podNamespace, SnapshotName: "cbt-md-s1"})
		require.NoError(t, err)
		_, err = stream.Recv()
		return err
	}
	apiToken := serviceAccountToken(t, "cbt-other-audience", "cbt-backup-snapshot-reader", podNamespace)
	assert.Equal(t, codes.Unauthenticated, status.Code(ask(apiToken)), "a token for the API server's audience")
	nobody := tokenFor(t, "cbt-nobody", cr.Spec.Audience)
	assert.Equal(t, codes.PermissionDenied, status.Code(ask(nobody)), "a tool that may not get the VolumeSnapshots")
	assert.Equal(t, codes.InvalidArgument, status.Code(ask("")), "no token")
}

// tokenFor is a token of a new ServiceAccount in podNamespace with no
// rights, for audience.
func tokenFor(t *testing.T, name, audience string) string {
	t.Helper()
	kubectl(t, "-n", podNamespace, "create", "serviceaccount", name)
	t.Cleanup(func() { _, _ = kubectlOut(context.Background(), "-n", podNamespace, "delete", "serviceaccount", name) })
	tr, err := env.kube.CoreV1().ServiceAccounts(podNamespace).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}}},
		metav1.CreateOptions{})
	require.NoError(t, err)
	return tr.Status.Token
}

func sidecarClient(t *testing.T, address string, ca []byte) api.SnapshotMetadataClient {
	t.Helper()
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(ca))
	conn, err := grpc.NewClient(address, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots})))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return api.NewSnapshotMetadataClient(conn)
}

// The figure, through the sidecar: a 1 GiB claim with 1 % of its
// 4 KiB blocks (2,621, scattered) written after a VolumeSnapshot; the
// delta answer lists exactly them (adjacent ones merged).
func testSnapshotMetadataDeltaOfOnePercentThroughTheSidecar(t *testing.T) {
	logsOnFailure(t)
	backupTool(t, "cbt-figure")
	claimIn(t, podNamespace, "cbt-gib", "1Gi", "volumeMode: Block")
	podIn(t, podNamespace, "cbt-gib-1", "127.0.0.3", "cbt-gib", "exec sleep 3600", true)
	const block, blocks = 4096, (1 << 30) / 4096
	require.NoError(t, takeVolumeSnapshot(t, podNamespace, "cbt-gib-s1", "cbt-gib"))
	waitVolumeSnapshotReady(t, podNamespace, "cbt-gib-s1")

	picked := map[int]bool{}
	rng := rand.New(rand.NewPCG(28, 1))
	for len(picked) < blocks/100 {
		picked[rng.IntN(blocks)] = true
	}
	indexes := slices.Sorted(func(yield func(int) bool) {
		for i := range picked {
			if !yield(i) {
				return
			}
		}
	})
	var script strings.Builder
	script.WriteString("for b in")
	for _, i := range indexes {
		script.WriteString(" " + strconv.Itoa(i))
	}
	script.WriteString("; do dd if=/dev/urandom of=" + blockDevice +
		" bs=4k seek=$b count=1 oflag=direct conv=notrunc 2>/dev/null || exit 1; done; sync; echo done")
	start := time.Now()
	exec1(t, "cbt-gib-1", script.String())
	t.Logf("%d blocks of 4 KiB written in %s", len(indexes), time.Since(start).Round(time.Millisecond))
	require.NoError(t, takeVolumeSnapshot(t, podNamespace, "cbt-gib-s2", "cbt-gib"))
	waitVolumeSnapshotReady(t, podNamespace, "cbt-gib-s2")

	var want [][2]int64
	for _, i := range indexes {
		if n := len(want); n > 0 && want[n-1][0]+want[n-1][1] == int64(i)*block {
			want[n-1][1] += block
			continue
		}
		want = append(want, [2]int64{int64(i) * block, block})
	}
	start = time.Now()
	delta := snapshotBlocks(t, "cbt-figure", "cbt-gib-s2", "cbt-gib-s1", 0)
	took := time.Since(start)
	require.Equal(t, want, delta.extents, "exactly the written blocks")
	var covered int64
	for _, e := range delta.extents {
		covered += e[1]
	}
	t.Logf("delta of a 1 GiB claim with 1%% written, through the sidecar: %d extents covering %.1f MiB in %d messages "+
		"(%.1f KiB encoded), in %s (token, lookups and TLS included)", len(delta.extents), float64(covered)/(1<<20),
		delta.records, float64(delta.bytes)/1024, took.Round(time.Millisecond))
	start = time.Now()
	allocated := snapshotBlocks(t, "cbt-figure", "cbt-gib-s2", "", 0)
	t.Logf("allocated blocks of the same snapshot: %d extents in %s", len(allocated.extents), time.Since(start).Round(time.Millisecond))
	assert.Equal(t, want, allocated.extents, "nothing was written before s1")
}
