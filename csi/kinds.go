package csi

import (
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// ControllerKinds are the kinds the controller services read from the
// cache (datastore.NewWatching): what package/manifests/11-rbac-csi.yaml
// lets the strata-csi-controller ServiceAccount list and watch, and nothing
// more. The node services read nothing from the API server.
var ControllerKinds = []schema.GroupResource{
	v1beta1.Resource("volumes"),             // Create/Delete/Expand, capacity, publish
	v1beta1.Resource("snapshots"),           // CreateSnapshot, ListSnapshots, content sources
	v1beta1.Resource("snapshotgroups"),      // Create/Get/DeleteVolumeGroupSnapshot
	v1beta1.Resource("volumeattachments"),   // publish tickets
	v1beta1.Resource("nodes"),               // topology, capacity, publish
	v1beta1.Resource("replicas"),            // GetCapacity: what each disk holds
	v1beta1.Resource("settings"),            // GetCapacity: over-provisioning and reserve
	v1beta1.Resource("backups"),             // restores (fromBackup)
	v1beta1.Resource("backingimages"),       // volumes on backing images
	storagev1.Resource("volumeattachments"), // the owners of csi-attacher tickets
	corev1.Resource("persistentvolumes"),    // a VolumeAttachment's volume
	corev1.Resource("nodes"),                // a Kubernetes node's Strata node label
	coordinationv1.Resource("leases"),       // which nodes' managers are alive
}
