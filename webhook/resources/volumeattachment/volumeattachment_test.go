package volumeattachment

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
	"github.com/strata-storage/strata/webhook/admission/admissiontest"
)

const ns = admissiontest.Namespace

func node(name string) *v1beta1.Node {
	return &v1beta1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
}

func volume(name string, migratable bool) *v1beta1.Volume {
	return &v1beta1.Volume{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: k8stypes.UID("uid-" + name)},
		Spec: v1beta1.VolumeSpec{Size: resource.MustParse("1Gi"), NumberOfReplicas: 1, Migratable: migratable}}
}

func ticket(id string, typ v1beta1.AttacherType, nodeID string, gen int64) *v1beta1.AttachmentTicket {
	return &v1beta1.AttachmentTicket{ID: id, Type: typ, NodeID: nodeID, Generation: gen}
}

// va is the attachment of volume vol with the given tickets, keyed by ID.
func va(vol string, tickets ...*v1beta1.AttachmentTicket) *v1beta1.VolumeAttachment {
	a := &v1beta1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: vol, Namespace: ns},
		Spec: v1beta1.VolumeAttachmentSpec{Volume: vol, AttachmentTickets: map[string]*v1beta1.AttachmentTicket{}}}
	for _, t := range tickets {
		a.Spec.AttachmentTickets[t.ID] = t
	}
	return a
}

func objects() []runtime.Object {
	return []runtime.Object{node("n1"), node("n2"), volume("v1", false), volume("mig", true)}
}

const csi, api, snap = v1beta1.AttacherTypeCSIAttacher, v1beta1.AttacherTypeStrataAPI, v1beta1.AttacherTypeSnapshotController

func TestMutatorCreate(t *testing.T) {
	longName := strings.Repeat("v", 64)
	tests := []struct {
		name       string
		obj        *v1beta1.VolumeAttachment
		wantLabels map[string]string
		wantOwners []metav1.OwnerReference
	}{
		{name: "label, owner and generation 1 for every ticket",
			obj:        va("v1", ticket("a", csi, "n1", 0), ticket("b", snap, "n2", 7)),
			wantLabels: map[string]string{types.LabelVolume: "v1"},
			wantOwners: []metav1.OwnerReference{{APIVersion: "strata.io/v1beta1", Kind: "Volume", Name: "v1", UID: "uid-v1"}}},
		{name: "no volume yet: label only",
			obj:        va("later", ticket("a", csi, "n1", 0)),
			wantLabels: map[string]string{types.LabelVolume: "later"}},
		{name: "a volume name too long for a label value",
			obj: va(longName)},
	}
	env := dstest.New(t, objects(), nil)
	h := admissiontest.NewHandler(t, NewMutator(env.DS), nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, obj := admissiontest.Mutate(t, h, Resource, admissiontest.Request(Resource, admissiontest.Admin, nil, tc.obj))
			require.True(t, resp.Allowed, admissiontest.Denial(resp))
			got := obj.(*v1beta1.VolumeAttachment)
			assert.Equal(t, tc.wantLabels, got.Labels)
			assert.Equal(t, tc.wantOwners, got.OwnerReferences)
			assert.Empty(t, got.Finalizers, "the seed asks for no cleanup")
			for id, tk := range got.Spec.AttachmentTickets {
				assert.EqualValues(t, 1, tk.Generation, "ticket %s", id)
			}
		})
	}
}

// The patch applies to what a client really sends, which may lack fields
// the Go type always writes (a ticket's generation, the labels map).
func TestMutatorPatchAppliesToSparseObjects(t *testing.T) {
	env := dstest.New(t, objects(), nil)
	h := admissiontest.NewHandler(t, NewMutator(env.DS), nil)
	req := admissiontest.Request(Resource, admissiontest.Admin, nil, va("v1"))
	req.Object.Raw = []byte(`{"apiVersion":"strata.io/v1beta1","kind":"VolumeAttachment",
		"metadata":{"name":"v1","namespace":"strata-system"},
		"spec":{"volume":"v1","attachmentTickets":{"a/b":{"id":"a/b","type":"csi-attacher","nodeID":"n1"}}}}`)
	resp, obj := admissiontest.Mutate(t, h, Resource, req)
	require.True(t, resp.Allowed, admissiontest.Denial(resp))
	assert.JSONEq(t, `[
		{"op":"add","path":"/metadata/labels","value":{"strata.io/volume":"v1"}},
		{"op":"add","path":"/metadata/ownerReferences","value":[{"apiVersion":"strata.io/v1beta1","kind":"Volume","name":"v1","uid":"uid-v1"}]},
		{"op":"add","path":"/spec/attachmentTickets/a~1b/generation","value":1}]`, admissiontest.SortedPatch(t, resp.Patch))
	got := obj.(*v1beta1.VolumeAttachment)
	assert.EqualValues(t, 1, got.Spec.AttachmentTickets["a/b"].Generation)
}

func TestMutatorUpdateGenerations(t *testing.T) {
	withParams := func(tk *v1beta1.AttachmentTicket, p map[string]string) *v1beta1.AttachmentTicket {
		tk.Parameters = p
		return tk
	}
	tests := []struct {
		name    string
		old     *v1beta1.VolumeAttachment
		obj     *v1beta1.VolumeAttachment
		wantGen map[string]int64
	}{
		{name: "unchanged tickets keep theirs, whatever the writer sent",
			old:     va("v1", ticket("a", csi, "n1", 5), ticket("b", snap, "n2", 2)),
			obj:     va("v1", ticket("a", csi, "n1", 0), ticket("b", snap, "n2", 9)),
			wantGen: map[string]int64{"a": 5, "b": 2}},
		{name: "a new ticket starts at 1",
			old:     va("v1", ticket("a", csi, "n1", 5)),
			obj:     va("v1", ticket("a", csi, "n1", 5), ticket("b", snap, "n2", 4)),
			wantGen: map[string]int64{"a": 5, "b": 1}},
		{name: "a changed node, type or parameters bumps by one",
			old: va("v1", ticket("node", csi, "n1", 5), ticket("type", snap, "n1", 1),
				withParams(ticket("params", api, "n1", 3), map[string]string{"disableFrontend": "false"})),
			obj: va("v1", ticket("node", csi, "n2", 5), ticket("type", api, "n1", 1),
				withParams(ticket("params", api, "n1", 3), map[string]string{"disableFrontend": "true"})),
			wantGen: map[string]int64{"node": 6, "type": 2, "params": 4}},
		{name: "empty and missing parameters are the same",
			old:     va("v1", withParams(ticket("a", api, "n1", 2), nil)),
			obj:     va("v1", withParams(ticket("a", api, "n1", 2), map[string]string{})),
			wantGen: map[string]int64{"a": 2}},
		{name: "a removed and re-added ticket starts again",
			old:     va("v1", ticket("b", snap, "n2", 3)),
			obj:     va("v1", ticket("a", csi, "n1", 8)),
			wantGen: map[string]int64{"a": 1}},
	}
	env := dstest.New(t, objects(), nil)
	h := admissiontest.NewHandler(t, NewMutator(env.DS), nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, obj := admissiontest.Mutate(t, h, Resource, admissiontest.Request(Resource, admissiontest.Manager, tc.old, tc.obj))
			require.True(t, resp.Allowed, admissiontest.Denial(resp))
			got := map[string]int64{}
			for id, tk := range obj.(*v1beta1.VolumeAttachment).Spec.AttachmentTickets {
				got[id] = tk.Generation
			}
			assert.Equal(t, tc.wantGen, got)
		})
	}
}

func TestMutatorUpdateOwner(t *testing.T) {
	env := dstest.New(t, objects(), nil)
	h := admissiontest.NewHandler(t, NewMutator(env.DS), nil)

	t.Run("an attachment created before its volume gets label and owner later", func(t *testing.T) {
		old := va("v1")
		resp, obj := admissiontest.Mutate(t, h, Resource, admissiontest.Request(Resource, admissiontest.Admin, old, va("v1")))
		require.True(t, resp.Allowed)
		got := obj.(*v1beta1.VolumeAttachment)
		assert.Equal(t, "v1", got.Labels[types.LabelVolume])
		require.Len(t, got.OwnerReferences, 1)
		assert.EqualValues(t, "uid-v1", got.OwnerReferences[0].UID)
	})
	t.Run("an owned attachment is not patched", func(t *testing.T) {
		owned := va("v1")
		owned.Labels = map[string]string{types.LabelVolume: "v1"}
		owned.OwnerReferences = []metav1.OwnerReference{{APIVersion: "strata.io/v1beta1", Kind: "Volume", Name: "v1", UID: "uid-v1"}}
		resp, _ := admissiontest.Mutate(t, h, Resource, admissiontest.Request(Resource, admissiontest.Admin, owned, owned.DeepCopy()))
		require.True(t, resp.Allowed)
		assert.Empty(t, resp.Patch)
	})
	t.Run("an attachment being deleted is left alone", func(t *testing.T) {
		deleting := va("v1")
		deleting.DeletionTimestamp = &metav1.Time{Time: dstest.Now}
		resp, _ := admissiontest.Mutate(t, h, Resource, admissiontest.Request(Resource, admissiontest.Admin, deleting, deleting.DeepCopy()))
		require.True(t, resp.Allowed)
		assert.Empty(t, resp.Patch)
	})
}

func TestValidatorCreate(t *testing.T) {
	tests := []struct {
		name    string
		obj     *v1beta1.VolumeAttachment
		wantMsg string
	}{
		{name: "valid", obj: va("v1", ticket("a", csi, "n1", 1), ticket("s", snap, "n2", 1))},
		{name: "no tickets", obj: va("v1")},
		{name: "no volume",
			obj:     func() *v1beta1.VolumeAttachment { a := va("v1"); a.Spec.Volume = ""; return a }(),
			wantMsg: "spec.volume: required: the name of the volume these tickets are for"},
		{name: "named after another volume",
			obj:     func() *v1beta1.VolumeAttachment { a := va("v1"); a.Name = "other"; return a }(),
			wantMsg: `metadata.name: must equal spec.volume "v1": a volume has one VolumeAttachment, named after it`},
		{name: "ticket key differs from its id",
			obj: func() *v1beta1.VolumeAttachment {
				a := va("v1")
				a.Spec.AttachmentTickets["key"] = ticket("id", csi, "n1", 1)
				return a
			}(),
			wantMsg: `spec.attachmentTickets[key].id: "id" differs from its map key "key": tickets are keyed by their ID`},
		{name: "null ticket",
			obj: func() *v1beta1.VolumeAttachment {
				a := va("v1")
				a.Spec.AttachmentTickets["a"] = nil
				return a
			}(),
			wantMsg: `spec.attachmentTickets[a]: must not be null`},
		{name: "unknown type",
			obj: va("v1", ticket("a", "longhorn-api", "n1", 1)),
			wantMsg: `spec.attachmentTickets[a].type: unknown attacher type "longhorn-api"; known: csi-attacher, strata-api, ` +
				`snapshot-controller, backup-controller, volume-clone-controller, salvage-controller, share-manager-controller, ` +
				`volume-restore-controller, volume-eviction-controller, volume-expansion-controller, bim-ds-controller, ` +
				`volume-rebuilding-controller`},
		{name: "no node",
			obj:     va("v1", ticket("a", api, "", 1)),
			wantMsg: `spec.attachmentTickets[a].nodeID: required: the node the ticket asks the volume to be attached to`},
		{name: "unknown node",
			obj:     va("v1", ticket("a", api, "n9", 1)),
			wantMsg: `spec.attachmentTickets[a].nodeID: "n9" is not a Strata node (there is no nodes.strata.io n9)`},
		{name: "owner reference without kind and name",
			obj: func() *v1beta1.VolumeAttachment {
				tk := ticket("a", snap, "n1", 1)
				tk.OwnerRef = &v1beta1.TicketOwnerReference{APIVersion: "strata.io/v1beta1"}
				return va("v1", tk)
			}(),
			wantMsg: `spec.attachmentTickets[a].ownerRef.kind: required: an owner reference names its object's kind; ` +
				`spec.attachmentTickets[a].ownerRef.name: required: an owner reference names its object's name`},
		{name: "owner reference without apiVersion",
			obj: func() *v1beta1.VolumeAttachment {
				tk := ticket("a", snap, "n1", 1)
				tk.OwnerRef = &v1beta1.TicketOwnerReference{Kind: "Snapshot", Name: "s1"}
				return va("v1", tk)
			}(),
			wantMsg: `spec.attachmentTickets[a].ownerRef.apiVersion: required: an owner reference names its object's apiVersion`},
		{name: "empty owner reference",
			obj: func() *v1beta1.VolumeAttachment {
				tk := ticket("a", snap, "n1", 1)
				tk.OwnerRef = &v1beta1.TicketOwnerReference{}
				return va("v1", tk)
			}(),
			wantMsg: `spec.attachmentTickets[a].ownerRef.apiVersion: required: an owner reference names its object's apiVersion; ` +
				`spec.attachmentTickets[a].ownerRef.kind: required: an owner reference names its object's kind; ` +
				`spec.attachmentTickets[a].ownerRef.name: required: an owner reference names its object's name`},
		{name: "complete owner reference",
			obj: func() *v1beta1.VolumeAttachment {
				tk := ticket("a", snap, "n1", 1)
				tk.OwnerRef = &v1beta1.TicketOwnerReference{APIVersion: "strata.io/v1beta1", Kind: "Snapshot", Name: "s1"}
				return va("v1", tk)
			}()},
		{name: "two CSI tickets on two nodes for a migratable volume",
			obj: va("mig", ticket("a", csi, "n1", 1), ticket("b", csi, "n2", 1))},
		{name: "two CSI tickets for a volume that is not migratable",
			obj: va("v1", ticket("a", csi, "n1", 1), ticket("b", csi, "n2", 1)),
			wantMsg: `spec.attachmentTickets: two csi-attacher tickets are allowed only for a migratable volume; ` +
				`volume "v1" is not migratable`},
		{name: "two CSI tickets on one node",
			obj:     va("mig", ticket("a", csi, "n1", 1), ticket("b", csi, "n1", 1)),
			wantMsg: `spec.attachmentTickets: the two csi-attacher tickets "a" and "b" must name different nodes; both name "n1"`},
		{name: "three CSI tickets",
			obj:     va("mig", ticket("a", csi, "n1", 1), ticket("b", csi, "n2", 1), ticket("c", csi, "n2", 1)),
			wantMsg: `spec.attachmentTickets: 3 csi-attacher tickets; at most 2 (the source and target of a live migration)`},
		{name: "two CSI tickets for a volume that does not exist",
			obj: va("gone", ticket("a", csi, "n1", 1), ticket("b", csi, "n2", 1)),
			wantMsg: `spec.attachmentTickets: two csi-attacher tickets need a migratable volume, ` +
				`and volume "gone" does not exist`},
	}
	env := dstest.New(t, objects(), nil)
	h := admissiontest.NewHandler(t, nil, NewValidator(env.DS))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.Validate(admissiontest.Request(Resource, admissiontest.Admin, nil, tc.obj))
			assert.Equal(t, tc.wantMsg, admissiontest.Denial(resp))
		})
	}
}

func TestValidatorUpdate(t *testing.T) {
	tests := []struct {
		name    string
		old     *v1beta1.VolumeAttachment
		obj     *v1beta1.VolumeAttachment
		wantMsg string
	}{
		{name: "add a ticket", old: va("v1"), obj: va("v1", ticket("a", api, "n1", 1))},
		{name: "the volume is immutable",
			old: va("v1"), obj: func() *v1beta1.VolumeAttachment { a := va("v1"); a.Spec.Volume = "v2"; return a }(),
			wantMsg: `spec.volume: is immutable: cannot change from "v1" to "v2"`},
		{name: "a ticket naming a node that left may stay",
			old: va("v1", ticket("a", api, "gone-node", 1)),
			obj: va("v1", ticket("a", api, "gone-node", 1), ticket("b", snap, "n1", 1))},
		{name: "a ticket moved to an unknown node",
			old:     va("v1", ticket("a", api, "n1", 1)),
			obj:     va("v1", ticket("a", api, "n9", 1)),
			wantMsg: `spec.attachmentTickets[a].nodeID: "n9" is not a Strata node (there is no nodes.strata.io n9)`},
		{name: "a second CSI ticket for a volume that is not migratable",
			old: va("v1", ticket("a", csi, "n1", 1)),
			obj: va("v1", ticket("a", csi, "n1", 1), ticket("b", csi, "n2", 1)),
			wantMsg: `spec.attachmentTickets: two csi-attacher tickets are allowed only for a migratable volume; ` +
				`volume "v1" is not migratable`},
		{name: "an unchanged pair of CSI tickets is not judged again",
			old: va("v1", ticket("a", csi, "n1", 1), ticket("b", csi, "n2", 1)),
			obj: va("v1", ticket("a", csi, "n1", 1), ticket("b", csi, "n2", 1), ticket("s", snap, "n1", 1))},
		{name: "an owner reference that loses its apiVersion",
			old: func() *v1beta1.VolumeAttachment {
				tk := ticket("a", snap, "n1", 1)
				tk.OwnerRef = &v1beta1.TicketOwnerReference{APIVersion: "strata.io/v1beta1", Kind: "Snapshot", Name: "s1"}
				return va("v1", tk)
			}(),
			obj: func() *v1beta1.VolumeAttachment {
				tk := ticket("a", snap, "n1", 1)
				tk.OwnerRef = &v1beta1.TicketOwnerReference{Kind: "Snapshot", Name: "s1"}
				return va("v1", tk)
			}(),
			wantMsg: `spec.attachmentTickets[a].ownerRef.apiVersion: required: an owner reference names its object's apiVersion`},
		{name: "a key and id that disagree are denied even when unchanged",
			old: func() *v1beta1.VolumeAttachment {
				a := va("v1")
				a.Spec.AttachmentTickets["key"] = ticket("id", api, "n1", 1)
				return a
			}(),
			obj: func() *v1beta1.VolumeAttachment {
				a := va("v1")
				a.Spec.AttachmentTickets["key"] = ticket("id", api, "n1", 1)
				return a
			}(),
			wantMsg: `spec.attachmentTickets[key].id: "id" differs from its map key "key": tickets are keyed by their ID`},
	}
	env := dstest.New(t, objects(), nil)
	h := admissiontest.NewHandler(t, nil, NewValidator(env.DS))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.Validate(admissiontest.Request(Resource, admissiontest.Manager, tc.old, tc.obj))
			assert.Equal(t, tc.wantMsg, admissiontest.Denial(resp))
		})
	}
}

func TestValidatorDisableFrontendParameter(t *testing.T) {
	withFrontend := func(tk *v1beta1.AttachmentTicket, value string) *v1beta1.AttachmentTicket {
		tk.Parameters = map[string]string{v1beta1.AttachmentParameterDisableFrontend: value}
		return tk
	}
	const badMaybe = `spec.attachmentTickets[a].parameters[disableFrontend]: must be "true", "false" or "any", got "maybe"`
	tests := []struct {
		name    string
		old     *v1beta1.VolumeAttachment // nil: create
		obj     *v1beta1.VolumeAttachment
		wantMsg string
	}{
		{name: "true", obj: va("v1", withFrontend(ticket("a", api, "n1", 1), "true"))},
		{name: "false", obj: va("v1", withFrontend(ticket("a", api, "n1", 1), "false"))},
		{name: "any, as the snapshot controller asks", obj: va("v1", withFrontend(ticket("a", snap, "n1", 1), "any"))},
		{name: "no parameter", obj: va("v1", ticket("a", api, "n1", 1))},
		{name: "maybe", obj: va("v1", withFrontend(ticket("a", api, "n1", 1), "maybe")), wantMsg: badMaybe},
		{name: "empty",
			obj:     va("v1", withFrontend(ticket("a", api, "n1", 1), "")),
			wantMsg: `spec.attachmentTickets[a].parameters[disableFrontend]: must be "true", "false" or "any", got ""`},
		{name: "upper case",
			obj:     va("v1", withFrontend(ticket("a", api, "n1", 1), "True")),
			wantMsg: `spec.attachmentTickets[a].parameters[disableFrontend]: must be "true", "false" or "any", got "True"`},
		{name: "a ticket changed to maybe",
			old:     va("v1", withFrontend(ticket("a", api, "n1", 1), "true")),
			obj:     va("v1", withFrontend(ticket("a", api, "n1", 1), "maybe")),
			wantMsg: badMaybe},
		{name: "a ticket stored with maybe before the rule does not block other changes",
			old: va("v1", withFrontend(ticket("a", api, "n1", 1), "maybe")),
			obj: va("v1", withFrontend(ticket("a", api, "n1", 1), "maybe"), ticket("b", snap, "n2", 1))},
	}
	env := dstest.New(t, objects(), nil)
	h := admissiontest.NewHandler(t, nil, NewValidator(env.DS))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var old runtime.Object
			if tc.old != nil {
				old = tc.old
			}
			resp := h.Validate(admissiontest.Request(Resource, admissiontest.Admin, old, tc.obj))
			assert.Equal(t, tc.wantMsg, admissiontest.Denial(resp))
		})
	}
}
