package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// SchemeGroupVersion is the group and version of every Strata kind.
var SchemeGroupVersion = schema.GroupVersion{Group: "strata.io", Version: "v1beta1"}

// Resource takes an unqualified resource and returns a group-qualified one.
func Resource(resource string) schema.GroupResource {
	return SchemeGroupVersion.WithResource(resource).GroupResource()
}

var (
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	AddToScheme   = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion,
		&Volume{}, &VolumeList{},
		&Engine{}, &EngineList{},
		&Replica{}, &ReplicaList{},
		&Snapshot{}, &SnapshotList{},
		&VolumeAttachment{}, &VolumeAttachmentList{},
		&BackingImage{}, &BackingImageList{},
		&Node{}, &NodeList{},
		&Setting{}, &SettingList{},
		&ResourceQuota{}, &ResourceQuotaList{},
		&BackupTarget{}, &BackupTargetList{},
		&BackupVolume{}, &BackupVolumeList{},
		&Backup{}, &BackupList{},
		&RecurringJob{}, &RecurringJobList{},
		&InstanceManager{}, &InstanceManagerList{},
		&SnapshotGroup{}, &SnapshotGroupList{},
	)
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}
