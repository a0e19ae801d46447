package datastore

import (
	"context"
	"sync"

	"github.com/sirupsen/logrus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
)

// OptionalKind is a kind another project installs, which Strata uses only
// while its CRD exists.
type OptionalKind struct {
	schema.GroupVersionResource
	Kind string
}

// CRDName is the name of the kind's CustomResourceDefinition.
func (k OptionalKind) CRDName() string { return k.Resource + "." + k.Group }

// The kinds quotas know: a KubeVirt VM's volumes are the claims its template
// names; VM snapshots and Harvester's VM backups snapshot all of them.
var (
	KindVirtualMachine = OptionalKind{schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1",
		Resource: "virtualmachines"}, "VirtualMachine"}
	KindVirtualMachineSnapshot = OptionalKind{schema.GroupVersionResource{Group: "snapshot.kubevirt.io", Version: "v1beta1",
		Resource: "virtualmachinesnapshots"}, "VirtualMachineSnapshot"}
	KindVirtualMachineBackup = OptionalKind{schema.GroupVersionResource{Group: "harvesterhci.io", Version: "v1beta1",
		Resource: "virtualmachinebackups"}, "VirtualMachineBackup"}
)

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// IndexByClaim maps a VM to the claims ("namespace/name") its template names.
const IndexByClaim = "by-claim"

// OptionalKinds watches the CRDs (metadata only) to tell which optional
// kinds exist, and caches VirtualMachines once their CRD appears.
type OptionalKinds struct {
	log  logrus.FieldLogger
	dyn  dynamic.Interface
	crds cache.SharedIndexInformer
	ctx  context.Context

	mu         sync.Mutex
	vms        cache.SharedIndexInformer // nil until the VM CRD exists
	vmHandlers []cache.ResourceEventHandler
	onChange   []func(OptionalKind)
}

// WatchOptionalKinds sets up ds.OptionalKinds; call it before Start.
func (ds *DataStore) WatchOptionalKinds(meta metadata.Interface, dyn dynamic.Interface) error {
	ok := &OptionalKinds{log: logrus.WithField("component", "optional-kinds"), dyn: dyn,
		crds: metadatainformer.NewFilteredMetadataInformer(meta, crdResource, "", ResyncPeriod, cache.Indexers{}, nil).Informer()}
	notify := func(obj any) {
		if tomb, isTomb := obj.(cache.DeletedFinalStateUnknown); isTomb {
			obj = tomb.Obj
		}
		if m, isMeta := obj.(metav1.Object); isMeta {
			ok.crdChanged(m.GetName())
		}
	}
	if _, err := ok.crds.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: notify, DeleteFunc: notify}); err != nil {
		return err
	}
	ds.OptionalKinds = ok
	ds.synced = append(ds.synced, ok.crds.HasSynced)
	ds.runners = append(ds.runners, ok.run)
	return nil
}

func (ok *OptionalKinds) run(ctx context.Context) {
	ok.mu.Lock()
	ok.ctx = ctx
	ok.mu.Unlock()
	go ok.crds.Run(ctx.Done())
}

// Installed tells whether the kind's CRD exists now.
func (ok *OptionalKinds) Installed(k OptionalKind) bool {
	if ok == nil {
		return false
	}
	_, exists, _ := ok.crds.GetStore().GetByKey(k.CRDName())
	return exists
}

// OnChange calls f when one of the kinds' CRDs appears or goes. Register
// before Start.
func (ok *OptionalKinds) OnChange(f func(OptionalKind)) {
	ok.mu.Lock()
	defer ok.mu.Unlock()
	ok.onChange = append(ok.onChange, f)
}

// AddVirtualMachineHandler adds h to the VM informer, now or once it starts.
func (ok *OptionalKinds) AddVirtualMachineHandler(h cache.ResourceEventHandler) error {
	ok.mu.Lock()
	defer ok.mu.Unlock()
	ok.vmHandlers = append(ok.vmHandlers, h)
	if ok.vms != nil {
		_, err := ok.vms.AddEventHandler(h)
		return err
	}
	return nil
}

func (ok *OptionalKinds) crdChanged(name string) {
	for _, k := range []OptionalKind{KindVirtualMachine, KindVirtualMachineSnapshot, KindVirtualMachineBackup} {
		if k.CRDName() != name {
			continue
		}
		ok.log.WithFields(logrus.Fields{"kind": k.Kind, "installed": ok.Installed(k)}).Info("Optional kind changed")
		if k == KindVirtualMachine && ok.Installed(k) {
			ok.startVirtualMachines()
		}
		ok.mu.Lock()
		fs := ok.onChange
		ok.mu.Unlock()
		for _, f := range fs {
			f(k)
		}
	}
}

// startVirtualMachines starts the VM cache the first time the CRD is seen.
// It is never stopped: a CRD deleted and made again finds it watching.
func (ok *OptionalKinds) startVirtualMachines() {
	ok.mu.Lock()
	defer ok.mu.Unlock()
	if ok.vms != nil || ok.ctx == nil {
		return
	}
	inf := dynamicinformer.NewFilteredDynamicInformer(ok.dyn, KindVirtualMachine.GroupVersionResource, "", ResyncPeriod,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc, IndexByClaim: indexVMClaims}, nil).Informer()
	for _, h := range ok.vmHandlers {
		if _, err := inf.AddEventHandler(h); err != nil {
			ok.log.WithError(err).Error("Cannot watch VirtualMachines")
			return
		}
	}
	ok.vms = inf
	go inf.Run(ok.ctx.Done())
}

func (ok *OptionalKinds) vmIndexer() cache.Indexer {
	if ok == nil {
		return nil
	}
	ok.mu.Lock()
	defer ok.mu.Unlock()
	if ok.vms == nil {
		return nil
	}
	return ok.vms.GetIndexer()
}

// VirtualMachinesSynced tells whether the VM cache exists and has listed.
func (ok *OptionalKinds) VirtualMachinesSynced() bool {
	if ok == nil {
		return false
	}
	ok.mu.Lock()
	defer ok.mu.Unlock()
	return ok.vms != nil && ok.vms.HasSynced()
}

// VirtualMachine is the cached VM, if VMs are watched and it exists.
func (ok *OptionalKinds) VirtualMachine(namespace, name string) (*unstructured.Unstructured, bool) {
	idx := ok.vmIndexer()
	if idx == nil {
		return nil, false
	}
	obj, exists, err := idx.GetByKey(namespace + "/" + name)
	if err != nil || !exists {
		return nil, false
	}
	return obj.(*unstructured.Unstructured), true
}

// VirtualMachinesIn lists the cached VMs of a namespace.
func (ok *OptionalKinds) VirtualMachinesIn(namespace string) []*unstructured.Unstructured {
	return ok.vmsBy(cache.NamespaceIndex, namespace)
}

// VirtualMachinesUsing lists the cached VMs whose template names the claim.
func (ok *OptionalKinds) VirtualMachinesUsing(c Claim) []*unstructured.Unstructured {
	return ok.vmsBy(IndexByClaim, c.Namespace+"/"+c.Name)
}

func (ok *OptionalKinds) vmsBy(index, value string) []*unstructured.Unstructured {
	idx := ok.vmIndexer()
	if idx == nil {
		return nil
	}
	objs, _ := idx.ByIndex(index, value)
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, obj := range objs {
		out = append(out, obj.(*unstructured.Unstructured))
	}
	return out
}

// VirtualMachineClaims are the claims a VM's template names: its
// persistentVolumeClaim volumes, and its dataVolume volumes, whose claim
// CDI names after the DataVolume.
func VirtualMachineClaims(vm *unstructured.Unstructured) []Claim {
	volumes, _, _ := unstructured.NestedSlice(vm.Object, "spec", "template", "spec", "volumes")
	var out []Claim
	for _, v := range volumes {
		vol, ok := v.(map[string]any)
		if !ok {
			continue
		}
		name, _, _ := unstructured.NestedString(vol, "persistentVolumeClaim", "claimName")
		if name == "" {
			name, _, _ = unstructured.NestedString(vol, "dataVolume", "name")
		}
		if name != "" {
			out = append(out, Claim{Namespace: vm.GetNamespace(), Name: name})
		}
	}
	return out
}

func indexVMClaims(obj any) ([]string, error) {
	vm, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, nil
	}
	var keys []string
	for _, c := range VirtualMachineClaims(vm) {
		keys = append(keys, c.Namespace+"/"+c.Name)
	}
	return keys, nil
}
