package volume

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/webhook/admission/admissiontest"
)

// attachment is volume's VolumeAttachment with the given tickets.
func attachment(volume string, tickets ...*v1beta1.AttachmentTicket) *v1beta1.VolumeAttachment {
	va := &v1beta1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: volume, Namespace: ns},
		Spec: v1beta1.VolumeAttachmentSpec{Volume: volume, AttachmentTickets: map[string]*v1beta1.AttachmentTicket{}}}
	for _, t := range tickets {
		va.Spec.AttachmentTickets[t.ID] = t
	}
	return va
}

func ticket(id string, typ v1beta1.AttacherType, node string) *v1beta1.AttachmentTicket {
	return &v1beta1.AttachmentTicket{ID: id, Type: typ, NodeID: node}
}

// deleteRequest is the DELETE the API server sends: the stored object in
// oldObject, none in object.
func deleteRequest(v *v1beta1.Volume) *admissionv1.AdmissionRequest {
	req := admissiontest.Request(Resource, admissiontest.Admin, v, v)
	req.Operation, req.Object = admissionv1.Delete, runtime.RawExtension{}
	return req
}

// A volume a workload holds attached is not deleted under it: the delete is
// refused, naming the tickets and how to remove them. System tickets
// (snapshot, backup, clone, ...) let go of a volume being deleted, so they
// do not block.
func TestValidatorDelete(t *testing.T) {
	const (
		api   = v1beta1.AttacherTypeStrataAPI
		csi   = v1beta1.AttacherTypeCSIAttacher
		snap  = v1beta1.AttacherTypeSnapshotController
		clone = v1beta1.AttacherTypeVolumeCloneController
	)
	named := func(name string) *v1beta1.Volume { return vol(func(v *v1beta1.Volume) { v.Name = name }) }
	deleting := vol(func(v *v1beta1.Volume) {
		v.Name = "deleting"
		v.DeletionTimestamp = &metav1.Time{Time: dstest.Now}
		v.Finalizers = []string{"strata.io/cleanup"}
	})
	odd := attachment("odd", ticket("me", api, "n1"))
	odd.Spec.Volume = "someone-else"
	objects := []runtime.Object{
		attachment("held", ticket("me", api, "node-2")),
		attachment("two", ticket("pod-b", csi, "n2"), ticket("admin", api, "n1"), ticket("snap-s1", snap, "n1")),
		attachment("system", ticket("snap-s1", snap, "n1"), ticket("clone-c", clone, "n2")),
		attachment("empty"),
		attachment("deleting", ticket("me", api, "n1")),
		attachment("odd-id", ticket("a/b~c", api, "n1")),
		odd,
	}
	tests := []struct {
		name    string
		obj     *v1beta1.Volume
		wantMsg string
	}{
		{name: "a strata-api ticket blocks",
			obj: named("held"),
			wantMsg: `volume held is in use: VolumeAttachment held holds workload ticket "me" (strata-api on node-2) ` +
				`in spec.attachmentTickets; detach it before deleting the volume by removing the ticket: ` +
				`kubectl -n strata-system patch va held --type json -p '[{"op":"remove","path":"/spec/attachmentTickets/me"}]'`},
		{name: "every workload ticket is named, system tickets are not",
			obj: named("two"),
			wantMsg: `volume two is in use: VolumeAttachment two holds workload tickets "admin" (strata-api on n1), ` +
				`"pod-b" (csi-attacher on n2) in spec.attachmentTickets; detach it before deleting the volume by ` +
				`removing the tickets: kubectl -n strata-system patch va two --type json -p ` +
				`'[{"op":"remove","path":"/spec/attachmentTickets/admin"},{"op":"remove","path":"/spec/attachmentTickets/pod-b"}]'`},
		{name: "a ticket ID is escaped in the JSON pointer",
			obj: named("odd-id"),
			wantMsg: `volume odd-id is in use: VolumeAttachment odd-id holds workload ticket "a/b~c" (strata-api on n1) ` +
				`in spec.attachmentTickets; detach it before deleting the volume by removing the ticket: ` +
				`kubectl -n strata-system patch va odd-id --type json -p '[{"op":"remove","path":"/spec/attachmentTickets/a~1b~0c"}]'`},
		{name: "system tickets do not block", obj: named("system")},
		{name: "no tickets", obj: named("empty")},
		{name: "no VolumeAttachment", obj: named("none")},
		{name: "an attachment naming another volume is not this volume's", obj: named("odd")},
		{name: "a volume already being deleted: a repeated delete changes nothing", obj: deleting},
	}
	env := dstest.New(t, append(threeNodes(), objects...), nil)
	h := admissiontest.NewHandler(t, nil, NewValidator(env.DS))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.Validate(deleteRequest(tc.obj))
			assert.Equal(t, tc.wantMsg, admissiontest.Denial(resp))
			if tc.wantMsg != "" {
				require.NotNil(t, resp.Result)
				assert.EqualValues(t, http.StatusConflict, resp.Result.Code)
			}
		})
	}
}

// TestValidatorDeleteReadsTheLiveAttachment: the cache still shows a
// ticket the user has just removed; the API server's copy decides, so
// "remove the ticket, then delete" is not refused.
func TestValidatorDeleteReadsTheLiveAttachment(t *testing.T) {
	tests := []struct {
		name    string
		live    *v1beta1.VolumeAttachment
		wantMsg string
	}{
		{name: "ticket removed, cache behind: allowed", live: attachment("held")},
		{name: "ticket still there: refused",
			live: attachment("held", ticket("me", v1beta1.AttacherTypeStrataAPI, "node-2")),
			wantMsg: `volume held is in use: VolumeAttachment held holds workload ticket "me" (strata-api on node-2) ` +
				`in spec.attachmentTickets; detach it before deleting the volume by removing the ticket: ` +
				`kubectl -n strata-system patch va held --type json -p '[{"op":"remove","path":"/spec/attachmentTickets/me"}]'`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := dstest.New(t, append(threeNodes(), attachment("held", ticket("me", v1beta1.AttacherTypeStrataAPI, "node-2"))), nil)
			env.Strata.PrependReactor("get", "volumeattachments", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, tc.live, nil
			})
			h := admissiontest.NewHandler(t, nil, NewValidator(env.DS))
			resp := h.Validate(deleteRequest(vol(func(v *v1beta1.Volume) { v.Name = "held" })))
			assert.Equal(t, tc.wantMsg, admissiontest.Denial(resp))
		})
	}
}
