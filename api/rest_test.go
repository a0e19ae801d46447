package api

import (
	"context"
	"encoding/json"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned"
	"github.com/strata-storage/strata/types"
)

const restNS = types.DefaultNamespace

func restVolume(name, size string) *v1beta1.Volume {
	return &v1beta1.Volume{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: restNS},
		Spec: v1beta1.VolumeSpec{Size: resource.MustParse(size), NumberOfReplicas: 2}}
}

func restSnapshot(name, volume string) *v1beta1.Snapshot {
	return &v1beta1.Snapshot{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: restNS,
		Labels: map[string]string{types.LabelVolume: volume}},
		Spec: v1beta1.SnapshotSpec{Volume: volume, CreateSnapshot: true}}
}

func restBackup(name string, state v1beta1.BackupState) *v1beta1.Backup {
	return &v1beta1.Backup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: restNS, Labels: map[string]string{types.LabelVolume: "v1"}},
		Status: v1beta1.BackupStatus{State: state, VolumeName: "v1", VolumeSize: 1 << 30}}
}

func restImage(name string, disks ...string) *v1beta1.BackingImage {
	bi := &v1beta1.BackingImage{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: restNS},
		Spec: v1beta1.BackingImageSpec{SourceType: v1beta1.BackingImageSourceTypeUpload,
			DiskFileSpecMap: map[string]*v1beta1.BackingImageDiskFileSpec{}}}
	for _, d := range disks {
		bi.Spec.DiskFileSpecMap[d] = &v1beta1.BackingImageDiskFileSpec{}
	}
	return bi
}

func restNode(name string) *v1beta1.Node {
	return &v1beta1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: restNS}}
}

// heldVA is a volume's VolumeAttachment with an API ticket.
func heldVA(volume, ticketID string) *v1beta1.VolumeAttachment {
	return &v1beta1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: volume, Namespace: restNS},
		Spec: v1beta1.VolumeAttachmentSpec{Volume: volume, AttachmentTickets: map[string]*v1beta1.AttachmentTicket{
			ticketID: {ID: ticketID, Type: v1beta1.AttacherTypeStrataAPI, NodeID: "node-1",
				Parameters: map[string]string{v1beta1.AttachmentParameterDisableFrontend: "false"},
				OwnerRef: &v1beta1.TicketOwnerReference{APIVersion: "coordination.k8s.io/v1", Kind: "Lease",
					Namespace: restNS, Name: ticketLeaseName(ticketID), UID: "lease-uid"}}}}}
}

func heldLease(ticketID, volume string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: ticketLeaseName(ticketID), Namespace: restNS, UID: "lease-uid",
		Labels: map[string]string{types.LabelComponent: types.ComponentAPITicket, types.LabelVolume: volume}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: new("alice"), LeaseDurationSeconds: new(int32(60)),
			RenewTime: &metav1.MicroTime{Time: dstest.Now}}}
}

// Every REST route through the handler: authentication, the access review
// of its verb, bad input naming the field, and what it writes.
func TestRESTRoutes(t *testing.T) {
	readOnly := map[string]bool{"get": true, "list": true}
	tests := []struct {
		name, method, path, body string
		noToken                  bool
		verbs                    map[string]bool // alice's verbs; nil: all
		wantCode                 int
		wantError, wantField     string
		wantEvent                string // in the one event recorded; none when empty
		setup                    func(t *testing.T, env *dstest.Env)
		check                    func(t *testing.T, env *dstest.Env, body map[string]any)
	}{
		{name: "no token", method: "GET", path: "/v1/volumes", noToken: true, wantCode: 401, wantError: "no Authorization header"},
		{name: "list volumes", method: "GET", path: "/v1/volumes", wantCode: 200,
			check: func(t *testing.T, _ *dstest.Env, body map[string]any) {
				assert.Len(t, body["items"], 2)
			}},
		{name: "list volumes forbidden", method: "GET", path: "/v1/volumes", verbs: map[string]bool{}, wantCode: 403,
			wantError: "may not list volumes.strata.io"},
		{name: "get a volume", method: "GET", path: "/v1/volumes/v1", wantCode: 200,
			check: func(t *testing.T, _ *dstest.Env, body map[string]any) {
				assert.Equal(t, "v1", body["metadata"].(map[string]any)["name"])
			}},
		{name: "get a missing volume", method: "GET", path: "/v1/volumes/nope", wantCode: 404, wantError: `volume "nope": not found`},
		{name: "get a volume the cache has not seen yet", method: "GET", path: "/v1/volumes/v1", wantCode: 200,
			// A client that just created it (kubectl strata backup restore
			// --wait) must not get a 404 from a cache a moment behind.
			setup: func(t *testing.T, env *dstest.Env) {
				require.NoError(t, env.DS.Volumes.Informer().GetIndexer().Delete(restVolume("v1", "1Gi")))
			},
			check: func(t *testing.T, _ *dstest.Env, body map[string]any) {
				assert.Equal(t, "v1", body["metadata"].(map[string]any)["name"])
			}},
		{name: "create a volume", method: "POST", path: "/v1/volumes", body: `{"name":"v3","size":"1Gi","numberOfReplicas":2}`,
			wantCode: 201, check: func(t *testing.T, env *dstest.Env, _ map[string]any) {
				strata := env.Strata
				v, err := strata.StrataV1beta1().Volumes(restNS).Get(context.Background(), "v3", metav1.GetOptions{})
				require.NoError(t, err)
				assert.Equal(t, "1Gi", v.Spec.Size.String())
				assert.Equal(t, v1beta1.VolumeFrontendNBD, v.Spec.Frontend)
			}},
		{name: "create: a negative size", method: "POST", path: "/v1/volumes", body: `{"name":"v3","size":"-1Gi"}`,
			wantCode: 400, wantField: "size", wantError: `"-1Gi" is not positive`},
		{name: "create: a size that is no quantity", method: "POST", path: "/v1/volumes", body: `{"name":"v3","size":"abc"}`,
			wantCode: 400, wantField: "size", wantError: `"abc" is not a size`},
		{name: "create: a bad name", method: "POST", path: "/v1/volumes", body: `{"name":"V_3","size":"1Gi"}`,
			wantCode: 400, wantField: "name"},
		{name: "create: an unknown field", method: "POST", path: "/v1/volumes", body: `{"name":"v3","size":"1Gi","replicas":2}`,
			wantCode: 400, wantField: "body", wantError: `unknown field "replicas"`},
		{name: "create: a field of the wrong type", method: "POST", path: "/v1/volumes", body: `{"name":"v3","size":"1Gi","numberOfReplicas":"2"}`,
			wantCode: 400, wantField: "numberOfReplicas"},
		{name: "create forbidden to a reader", method: "POST", path: "/v1/volumes", body: `{"name":"v3","size":"1Gi"}`,
			verbs: readOnly, wantCode: 403, wantError: `may not create volumes.strata.io "v3"`},
		{name: "delete a volume", method: "DELETE", path: "/v1/volumes/v2", wantCode: 204,
			check: func(t *testing.T, env *dstest.Env, _ map[string]any) {
				strata := env.Strata
				_, err := strata.StrataV1beta1().Volumes(restNS).Get(context.Background(), "v2", metav1.GetOptions{})
				assert.Error(t, err)
			}},
		{name: "expand", method: "POST", path: "/v1/volumes/v1?action=expand", body: `{"size":"2Gi"}`, wantCode: 200,
			check: func(t *testing.T, env *dstest.Env, _ map[string]any) {
				strata := env.Strata
				v, err := strata.StrataV1beta1().Volumes(restNS).Get(context.Background(), "v1", metav1.GetOptions{})
				require.NoError(t, err)
				assert.Equal(t, "2Gi", v.Spec.Size.String())
			}},
		{name: "expand: smaller", method: "POST", path: "/v1/volumes/v1?action=expand", body: `{"size":"512Mi"}`,
			wantCode: 400, wantField: "size", wantError: "volumes only grow"},
		{name: "an unknown action", method: "POST", path: "/v1/volumes/v1?action=shrink", body: `{}`,
			wantCode: 400, wantField: "action", wantError: `unknown action "shrink": one of attach, detach, expand, revert, snapshotBlocks, snapshotCRCreate`},
		{name: "no action", method: "POST", path: "/v1/volumes/v1", body: `{}`, wantCode: 400, wantField: "action"},
		{name: "snapshotCRCreate", method: "POST", path: "/v1/volumes/v1?action=snapshotCRCreate", body: `{"name":"s9","labels":{"k":"v"}}`,
			wantCode: 200, check: func(t *testing.T, env *dstest.Env, _ map[string]any) {
				strata := env.Strata
				s, err := strata.StrataV1beta1().Snapshots(restNS).Get(context.Background(), "s9", metav1.GetOptions{})
				require.NoError(t, err)
				assert.Equal(t, v1beta1.SnapshotSpec{Volume: "v1", CreateSnapshot: true, Labels: map[string]string{"k": "v"}}, s.Spec)
			}},
		{name: "snapshotCRCreate on a missing volume", method: "POST", path: "/v1/volumes/nope?action=snapshotCRCreate", body: `{}`,
			wantCode: 404},
		{name: "snapshotCRList", method: "POST", path: "/v1/volumes/v1?action=snapshotCRList", wantCode: 200,
			check: func(t *testing.T, _ *dstest.Env, body map[string]any) {
				require.Len(t, body["items"], 1)
				assert.Equal(t, "s1", body["items"].([]any)[0].(map[string]any)["metadata"].(map[string]any)["name"])
			}},
		{name: "snapshotCRGet", method: "POST", path: "/v1/volumes/v1?action=snapshotCRGet", body: `{"name":"s1"}`, wantCode: 200},
		{name: "snapshotCRGet of another volume's snapshot", method: "POST", path: "/v1/volumes/v1?action=snapshotCRGet",
			body: `{"name":"s2"}`, wantCode: 404, wantError: `snapshot "s2" of volume "v1": not found`},
		{name: "snapshotCRGet without a name", method: "POST", path: "/v1/volumes/v1?action=snapshotCRGet", body: `{}`,
			wantCode: 400, wantField: "name"},
		{name: "snapshotCRDelete", method: "POST", path: "/v1/volumes/v1?action=snapshotCRDelete", body: `{"name":"s1"}`, wantCode: 204,
			check: func(t *testing.T, env *dstest.Env, _ map[string]any) {
				strata := env.Strata
				_, err := strata.StrataV1beta1().Snapshots(restNS).Get(context.Background(), "s1", metav1.GetOptions{})
				assert.Error(t, err)
			}},
		{name: "snapshotCRDelete forbidden to a reader", method: "POST", path: "/v1/volumes/v1?action=snapshotCRDelete",
			body: `{"name":"s1"}`, verbs: readOnly, wantCode: 403, wantError: `may not delete snapshots.strata.io "s1"`},
		{name: "namespace quota", method: "POST", path: "/v1/namespaces/apps?action=updateResourceQuota",
			body: `{"totalSnapshotSizeQuota":"10Gi"}`, wantCode: 200,
			check: func(t *testing.T, env *dstest.Env, _ map[string]any) {
				strata := env.Strata
				rq, err := strata.StrataV1beta1().ResourceQuotas("apps").Get(context.Background(), v1beta1.DefaultResourceQuotaName, metav1.GetOptions{})
				require.NoError(t, err)
				assert.Equal(t, "10Gi", rq.Spec.SnapshotLimit.NamespaceTotalSnapshotSizeQuota.String())
			}},
		{name: "namespace quota: negative", method: "POST", path: "/v1/namespaces/apps?action=updateResourceQuota",
			body: `{"totalSnapshotSizeQuota":"-1Gi"}`, wantCode: 400, wantField: "totalSnapshotSizeQuota", wantError: `"-1Gi" is negative`},
		{name: "namespace quota: not a quantity", method: "POST", path: "/v1/namespaces/apps?action=updateResourceQuota",
			body: `{"totalSnapshotSizeQuota":"abc"}`, wantCode: 400, wantField: "totalSnapshotSizeQuota", wantError: `"abc" is not a size`},
		{name: "namespace quota: a reader may not", method: "POST", path: "/v1/namespaces/apps?action=updateResourceQuota",
			body: `{"totalSnapshotSizeQuota":"10Gi"}`, verbs: readOnly, wantCode: 403,
			wantError: `may not update resourcequotas.strata.io "default-resource-quota" in namespace apps`},
		{name: "namespace quota deleted", method: "POST", path: "/v1/namespaces/quota?action=deleteResourceQuota", wantCode: 200,
			check: func(t *testing.T, env *dstest.Env, _ map[string]any) {
				strata := env.Strata
				rq, err := strata.StrataV1beta1().ResourceQuotas("quota").Get(context.Background(), v1beta1.DefaultResourceQuotaName, metav1.GetOptions{})
				require.NoError(t, err)
				assert.Nil(t, rq.Spec.SnapshotLimit.NamespaceTotalSnapshotSizeQuota)
			}},
		{name: "VM quota of a VM the cluster does not have", method: "POST", path: "/v1/virtualmachines/apps/vm1?action=updateResourceQuota",
			body: `{"totalSnapshotSizeQuota":"10Gi"}`, wantCode: 404, wantError: "virtual machine apps/vm1"},
		{name: "the OpenAPI document", method: "GET", path: "/v1/openapi.yaml", wantCode: 200},
		{name: "attach", method: "POST", path: "/v1/volumes/v1?action=attach", body: `{"node":"node-1","ttlSeconds":60}`, wantCode: 200,
			wantEvent: "Normal AttachRequested ticket api-",
			check: func(t *testing.T, env *dstest.Env, body map[string]any) {
				id, _ := body["ticketID"].(string)
				require.Regexp(t, ticketIDPattern, id)
				va, err := env.Strata.StrataV1beta1().VolumeAttachments(restNS).Get(context.Background(), "v1", metav1.GetOptions{})
				require.NoError(t, err)
				ticket := va.Spec.AttachmentTickets[id]
				require.NotNil(t, ticket)
				assert.Equal(t, v1beta1.AttacherTypeStrataAPI, ticket.Type)
				assert.Equal(t, "node-1", ticket.NodeID)
				assert.Equal(t, "false", ticket.Parameters[v1beta1.AttachmentParameterDisableFrontend])
				lease, err := env.Kube.CoordinationV1().Leases(restNS).Get(context.Background(), ticket.OwnerRef.Name, metav1.GetOptions{})
				require.NoError(t, err, "the ticket is owned by a Lease")
				assert.Equal(t, "Lease", ticket.OwnerRef.Kind)
				assert.Equal(t, int32(60), *lease.Spec.LeaseDurationSeconds)
				assert.Equal(t, alice.Username, *lease.Spec.HolderIdentity)
				assert.Equal(t, types.ComponentAPITicket, lease.Labels[types.LabelComponent])
			}},
		{name: "attach renews its ticket's lease", method: "POST", path: "/v1/volumes/v1?action=attach",
			body: `{"node":"node-1","ticketID":"api-held"}`, wantCode: 200,
			check: func(t *testing.T, env *dstest.Env, body map[string]any) {
				lease, err := env.Kube.CoordinationV1().Leases(restNS).Get(context.Background(), "strata-api-held", metav1.GetOptions{})
				require.NoError(t, err)
				assert.True(t, lease.Spec.RenewTime.After(dstest.Now), "renewed")
				assert.Equal(t, int32(defaultTicketTTL.Seconds()), *lease.Spec.LeaseDurationSeconds)
				assert.Equal(t, "api-held", body["ticketID"])
			}},
		{name: "attach to a node that is not Strata's", method: "POST", path: "/v1/volumes/v1?action=attach", body: `{"node":"node-9"}`,
			wantCode: 400, wantField: "node"},
		{name: "attach with a lease too short", method: "POST", path: "/v1/volumes/v1?action=attach",
			body: `{"node":"node-1","ttlSeconds":5}`, wantCode: 400, wantField: "ttlSeconds"},
		{name: "attach with a ticket ID the API did not give", method: "POST", path: "/v1/volumes/v1?action=attach",
			body: `{"node":"node-1","ticketID":"csi-1"}`, wantCode: 400, wantField: "ticketID"},
		{name: "attach forbidden to a reader", method: "POST", path: "/v1/volumes/v1?action=attach", body: `{"node":"node-1"}`,
			verbs: readOnly, wantCode: 403, wantError: `may not update volumeattachments.strata.io "v1"`},
		{name: "detach", method: "POST", path: "/v1/volumes/v1?action=detach", body: `{"ticketID":"api-held"}`, wantCode: 204,
			wantEvent: "Normal DetachRequested ticket api-held removed by " + alice.Username + " (REST API)",
			check: func(t *testing.T, env *dstest.Env, _ map[string]any) {
				va, err := env.Strata.StrataV1beta1().VolumeAttachments(restNS).Get(context.Background(), "v1", metav1.GetOptions{})
				require.NoError(t, err)
				assert.NotContains(t, va.Spec.AttachmentTickets, "api-held")
				_, err = env.Kube.CoordinationV1().Leases(restNS).Get(context.Background(), "strata-api-held", metav1.GetOptions{})
				assert.Error(t, err, "the Lease goes with the ticket")
			}},
		{name: "revert while a ticket holds the volume", method: "POST", path: "/v1/volumes/v1?action=revert", body: `{"snapshot":"s1"}`,
			wantCode: 409, wantError: `volume "v1" is in use: a revert needs it detached and unclaimed, and tickets hold it: api-held (strata-api on node-1)`},
		{name: "revert to another volume's snapshot", method: "POST", path: "/v1/volumes/v2?action=revert", body: `{"snapshot":"s1"}`,
			wantCode: 404, wantError: `snapshot "s1" of volume "v2": not found`},
		{name: "revert without a snapshot", method: "POST", path: "/v1/volumes/v2?action=revert", body: `{}`,
			wantCode: 400, wantField: "snapshot"},
		{name: "revert forbidden to a reader", method: "POST", path: "/v1/volumes/v2?action=revert", body: `{"snapshot":"s2"}`,
			verbs: readOnly, wantCode: 403, wantError: `may not update volumes.strata.io "v2"`},
		{name: "blocks without a snapshot", method: "POST", path: "/v1/volumes/v1?action=snapshotBlocks", body: `{}`,
			wantCode: 400, wantField: "snapshot"},
		{name: "blocks with the snapshot as its own base", method: "POST", path: "/v1/volumes/v1?action=snapshotBlocks",
			body: `{"snapshot":"s1","base":"s1"}`, wantCode: 400, wantField: "base"},
		{name: "blocks from a negative offset", method: "POST", path: "/v1/volumes/v1?action=snapshotBlocks",
			body: `{"snapshot":"s1","startingOffset":-1}`, wantCode: 400, wantField: "startingOffset"},
		{name: "blocks, too many per page", method: "POST", path: "/v1/volumes/v1?action=snapshotBlocks",
			body: `{"snapshot":"s1","maxResults":100001}`, wantCode: 400, wantField: "maxResults"},
		{name: "blocks of another volume's snapshot", method: "POST", path: "/v1/volumes/v2?action=snapshotBlocks",
			body: `{"snapshot":"s1"}`, wantCode: 404, wantError: `snapshot: snapshot "s1" of volume "v2", taken: not found`},
		{name: "blocks need get snapshots", method: "POST", path: "/v1/volumes/v1?action=snapshotBlocks", body: `{"snapshot":"s1"}`,
			verbs: map[string]bool{"list": true}, wantCode: 403, wantError: `may not get snapshots.strata.io "s1"`},
		{name: "list backups", method: "GET", path: "/v1/backups", wantCode: 200,
			check: func(t *testing.T, _ *dstest.Env, body map[string]any) { assert.Len(t, body["items"], 2) }},
		{name: "back a volume up", method: "POST", path: "/v1/backups", body: `{"name":"b9","volume":"v1"}`, wantCode: 201,
			check: func(t *testing.T, env *dstest.Env, _ map[string]any) {
				b, err := env.Strata.StrataV1beta1().Backups(restNS).Get(context.Background(), "b9", metav1.GetOptions{})
				require.NoError(t, err)
				assert.Equal(t, "v1", b.Labels[types.LabelVolume])
			}},
		{name: "back up without a volume", method: "POST", path: "/v1/backups", body: `{"name":"b9"}`, wantCode: 400, wantField: "volume"},
		{name: "back up a missing volume", method: "POST", path: "/v1/backups", body: `{"volume":"nope"}`, wantCode: 404},
		{name: "restore a completed backup", method: "POST", path: "/v1/backups/b1?action=restore", body: `{"name":"v9"}`, wantCode: 201,
			check: func(t *testing.T, env *dstest.Env, _ map[string]any) {
				v, err := env.Strata.StrataV1beta1().Volumes(restNS).Get(context.Background(), "v9", metav1.GetOptions{})
				require.NoError(t, err)
				assert.Equal(t, "b1", v.Spec.FromBackup)
				assert.Equal(t, "1Gi", v.Spec.Size.String(), "the backed-up volume's size")
			}},
		{name: "a restore needs get on the backup", method: "POST", path: "/v1/backups/b1?action=restore", body: `{"name":"v9"}`,
			verbs: map[string]bool{"create": true}, wantCode: 403, wantError: `may not get backups.strata.io "b1"`},
		{name: "a backup needs get on the volume", method: "POST", path: "/v1/backups", body: `{"name":"b9","volume":"v1"}`,
			verbs: map[string]bool{"create": true}, wantCode: 403, wantError: `may not get volumes.strata.io "v1"`},
		{name: "restore a backup in progress", method: "POST", path: "/v1/backups/b2?action=restore", body: `{"name":"v9"}`,
			wantCode: 409, wantError: `backup "b2" is InProgress: only a completed backup can be restored`},
		{name: "delete a backup", method: "DELETE", path: "/v1/backups/b1", wantCode: 204},
		{name: "create a backing image", method: "POST", path: "/v1/backingimages",
			body: `{"name":"img9","sourceType":"download","url":"https://example.com/img.qcow2"}`, wantCode: 201,
			check: func(t *testing.T, env *dstest.Env, _ map[string]any) {
				bi, err := env.Strata.StrataV1beta1().BackingImages(restNS).Get(context.Background(), "img9", metav1.GetOptions{})
				require.NoError(t, err)
				assert.Equal(t, "https://example.com/img.qcow2", bi.Spec.SourceParameters[v1beta1.BackingImageParameterURL])
			}},
		{name: "an export needs get on the volume", method: "POST", path: "/v1/backingimages",
			body: `{"name":"img9","sourceType":"export-from-volume","volume":"v1"}`, verbs: map[string]bool{"create": true},
			wantCode: 403, wantError: `may not get volumes.strata.io "v1"`},
		{name: "a backing image of an unknown source type", method: "POST", path: "/v1/backingimages",
			body: `{"name":"img9","sourceType":"ftp"}`, wantCode: 400, wantField: "sourceType"},
		{name: "a download without a URL", method: "POST", path: "/v1/backingimages",
			body: `{"name":"img9","sourceType":"download","url":"file:///etc/passwd"}`, wantCode: 400, wantField: "url"},
		{name: "list backing images", method: "GET", path: "/v1/backingimages", wantCode: 200,
			check: func(t *testing.T, _ *dstest.Env, body map[string]any) { assert.Len(t, body["items"], 1) }},
		{name: "clean a disk's copy up", method: "POST", path: "/v1/backingimages/img1?action=backingImageCleanup",
			body: `{"disks":["disk-b"]}`, wantCode: 200,
			check: func(t *testing.T, env *dstest.Env, _ map[string]any) {
				bi, err := env.Strata.StrataV1beta1().BackingImages(restNS).Get(context.Background(), "img1", metav1.GetOptions{})
				require.NoError(t, err)
				assert.Contains(t, bi.Spec.DiskFileSpecMap, "disk-a")
				assert.NotContains(t, bi.Spec.DiskFileSpecMap, "disk-b")
			}},
		{name: "clean up a disk without a copy", method: "POST", path: "/v1/backingimages/img1?action=backingImageCleanup",
			body: `{"disks":["disk-z"]}`, wantCode: 400, wantField: "disks", wantError: `backing image "img1" has no copy on disk-z`},
		{name: "delete a backing image", method: "DELETE", path: "/v1/backingimages/img1", wantCode: 204},
		{name: "download a backing image", method: "GET", path: "/v1/backingimages/img1/download", wantCode: 200},
		{name: "download forbidden", method: "GET", path: "/v1/backingimages/img1/download", verbs: map[string]bool{}, wantCode: 403,
			wantError: `may not get backingimages.strata.io "img1"`},
		{name: "detach an unknown ticket", method: "POST", path: "/v1/volumes/v1?action=detach", body: `{"ticketID":"api-nope"}`,
			wantCode: 404},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			quota := &v1beta1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: v1beta1.DefaultResourceQuotaName, Namespace: "quota"},
				Spec: v1beta1.ResourceQuotaSpec{SnapshotLimit: v1beta1.SnapshotLimit{NamespaceTotalSnapshotSizeQuota: new(resource.MustParse("5Gi"))}}}
			env := dstest.New(t, []runtime.Object{restVolume("v1", "1Gi"), restVolume("v2", "1Gi"),
				restSnapshot("s1", "v1"), restSnapshot("s2", "v2"), quota, restNode("node-1"), heldVA("v1", "api-held"),
				restBackup("b1", v1beta1.BackupStateCompleted), restBackup("b2", v1beta1.BackupStateInProgress),
				restImage("img1", "disk-a", "disk-b")},
				[]runtime.Object{heldLease("api-held", "v1")})
			if tc.setup != nil {
				tc.setup(t, env)
			}
			kube := newFakeKube(alice.Username)
			kube.verbs = tc.verbs
			events := record.NewFakeRecorder(10)
			opts := Options{Log: quietLog(), REST: RESTOptions{Auth: NewKubeAuth(kube), Cache: env.DS, Namespace: restNS, Recorder: events,
				Clients: func(token string) (versioned.Interface, error) {
					assert.Equal(t, "good", token, "writes are made with the caller's token")
					return env.Strata, nil
				}}}
			r := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body))
			if !tc.noToken {
				r.Header.Set("Authorization", "Bearer good")
			}
			w := httptest.NewRecorder()
			NewHandler(&fakeImages{}, opts).ServeHTTP(w, r)

			require.Equal(t, tc.wantCode, w.Code, w.Body.String())
			var got map[string]any
			if w.Body.Len() > 0 && w.Header().Get("Content-Type") == "application/json" {
				require.NoError(t, json.Unmarshal(w.Body.Bytes(), &got), w.Body.String())
			}
			if tc.wantError != "" {
				assert.Contains(t, got["error"], tc.wantError)
			}
			if tc.wantField != "" {
				assert.Equal(t, tc.wantField, got["field"])
			}
			if tc.check != nil {
				tc.check(t, env, got)
			}
			close(events.Events)
			var recorded []string
			for e := range events.Events {
				recorded = append(recorded, e)
			}
			if tc.wantEvent == "" {
				assert.Empty(t, recorded, "no event: nothing a user did changed (a renewal, a refusal, a read)")
			} else if assert.Len(t, recorded, 1) {
				assert.Contains(t, recorded[0], tc.wantEvent)
			}
		})
	}
}

// A manager that starts releases the revert tickets of its own node (it
// was killed mid-revert) and no other Lease: another node's revert, a
// client's attachment.
func TestReleaseRevertTickets(t *testing.T) {
	reverting := func(ticketID, node string) *coordinationv1.Lease {
		l := heldLease(ticketID, "v1")
		l.UID = k8stypes.UID("uid-" + ticketID)
		l.Labels[types.LabelRevertingNode] = node
		return l
	}
	env := dstest.New(t, []runtime.Object{restVolume("v1", "1Gi")},
		[]runtime.Object{reverting("api-mine", "node-1"), reverting("api-theirs", "node-2"), heldLease("api-client", "v1")})
	require.NoError(t, ReleaseRevertTickets(context.Background(), env.DS, "node-1", quietLog()))
	leases, err := env.Kube.CoordinationV1().Leases(restNS).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	var names []string
	for _, l := range leases.Items {
		names = append(names, l.Name)
	}
	assert.ElementsMatch(t, []string{"strata-api-theirs", "strata-api-client"}, names)
}
