package backingimage

import (
	"context"
	"crypto/tls"
	"net/http"
	"slices"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/api/equality"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// BackingImageController keeps backing images' copies on disks. Every
// manager runs it for the disks of its own node; the image's owner also
// makes the image-wide decisions (backing_image_controller.go). The data
// itself is moved by this manager — never by the instance manager or a
// replica, so one copy per disk serves every replica there — fetched from
// the source once onto one disk, then copied disk to disk, data extents
// only, through the peers' HTTP endpoints (backing_image_local.go).
type BackingImageController struct {
	*kit.BaseController
	files      *fileJobs
	httpClient *http.Client
	peerScheme string // https, or http in unit tests
	// UploadLimit bounds an uploaded image's size in bytes.
	uploadLimit int64
}

// NewBackingImageController wires the backing image controller of node
// controllerID. uploadLimit bounds uploads (bytes; 0: no upload accepted).
func NewBackingImageController(logger logrus.FieldLogger, ds *datastore.DataStore, recorder record.EventRecorder,
	controllerID string, dataPlane engineapi.Connector, uploadLimit int64, peerTLS *tls.Config) (*BackingImageController, error) {
	c := &BackingImageController{
		BaseController: kit.NewBaseController("strata-backing-image", controllerID, logger, ds, recorder),
		// For copies from peers only (a download from the image's URL has
		// its own client: imagefile.DownloadPolicy), over HTTPS with this
		// manager's certificate (peerTLS; nil: plain HTTP, unit tests). No
		// overall timeout: an image may take hours; a stalled peer is
		// caught by the transport's header timeout and a cancelled job.
		httpClient: &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment,
			ResponseHeaderTimeout: time.Minute, TLSClientConfig: peerTLS, DialTLSContext: pki.DialTLSContext(peerTLS)}},
		peerScheme:  map[bool]string{true: "https", false: "http"}[peerTLS != nil],
		uploadLimit: uploadLimit,
	}
	c.DataPlane = dataPlane
	c.files = newFileJobs(c.enqueueByUID)
	c.Sync = c.syncBackingImage
	if _, err := ds.BackingImages.Informer().AddEventHandler(c.EnqueueOnChange()); err != nil {
		return nil, err
	}
	// Replicas decide which copies are in use (cleanup) and ask for copies.
	if _, err := ds.Replicas.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: kit.OnAdd(c.enqueueImageOf),
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.Replica) {
			if o.Spec.DiskID != n.Spec.DiskID || o.Spec.BackingImage != n.Spec.BackingImage ||
				(o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) {
				c.enqueueImageOf(o)
				c.enqueueImageOf(n)
			}
		}),
		DeleteFunc: kit.OnDelete(c.enqueueImageOf),
	}); err != nil {
		return nil, err
	}
	// A disk found or lost changes where copies can be, and who serves them.
	if _, err := ds.Nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: kit.OnAdd(func(*v1beta1.Node) { c.enqueueAll() }),
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.Node) {
			if !slices.Equal(diskUUIDs(o), diskUUIDs(n)) || o.Status.APIAddress != n.Status.APIAddress ||
				!equality.Semantic.DeepEqual(o.Spec.Disks, n.Spec.Disks) {
				c.enqueueAll()
			}
		}),
	}); err != nil {
		return nil, err
	}
	// An export waits for its snapshot and for the volume's engine.
	if _, err := ds.Snapshots.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.Snapshot) {
			if n.Labels[types.LabelBackingImage] != "" &&
				(o.Status.ReadyToUse != n.Status.ReadyToUse || o.Status.Error != n.Status.Error) {
				c.Queue.Add(n.Namespace + "/" + n.Labels[types.LabelBackingImage])
			}
		}),
	}); err != nil {
		return nil, err
	}
	if _, err := ds.Engines.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.Engine) {
			if o.Status.CurrentState != n.Status.CurrentState {
				c.enqueueExportsOf(n.Spec.VolumeName)
			}
		}),
	}); err != nil {
		return nil, err
	}
	if _, err := ds.Settings.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: kit.OnUpdate(func(o, st *v1beta1.Setting) {
			if isBackingImageLimitSetting(st.Name) && o.Value != st.Value {
				c.files.noteLimitSettingChanged(types.SettingName(st.Name))
				c.enqueueAll()
			}
			if st.Name == string(types.SettingBackingImageCleanupWaitInterval) {
				c.enqueueAll()
			}
		}),
	}); err != nil {
		return nil, err
	}
	return c, c.RequeueOnNodeReadyChange(c.enqueueAll)
}

// Run removes stray copies left while this manager was down, then runs the
// workers; transfers run under ctx.
func (c *BackingImageController) Run(ctx context.Context, workers int) {
	c.files.mu.Lock()
	c.files.runCtx = ctx
	c.files.mu.Unlock()
	c.removeStrayCopies()
	c.BaseController.Run(ctx, workers)
}

// enqueueImageOf enqueues the image a replica uses, if any.
func (c *BackingImageController) enqueueImageOf(r *v1beta1.Replica) {
	if r.Spec.BackingImage != "" {
		c.Queue.Add(r.Namespace + "/" + r.Spec.BackingImage)
	}
}

// enqueueExportsOf enqueues the images exported from a volume.
func (c *BackingImageController) enqueueExportsOf(volume string) {
	images, err := c.DS.BackingImages.ListByIndexRO(datastore.IndexByVolume, volume)
	if err != nil {
		return
	}
	for _, bi := range images {
		c.Enqueue(bi)
	}
}

func (c *BackingImageController) enqueueAll() {
	for _, key := range c.DS.BackingImages.Informer().GetStore().ListKeys() {
		c.Queue.Add(key)
	}
}

// enqueueByUID enqueues the image a transfer belongs to.
func (c *BackingImageController) enqueueByUID(uid k8stypes.UID) {
	images, err := c.DS.BackingImages.ListRO(nil)
	if err != nil {
		return
	}
	for _, bi := range images {
		if bi.UID == uid {
			c.Enqueue(bi)
			return
		}
	}
}

// diskUUIDs lists a node's disk UUIDs, sorted.
func diskUUIDs(n *v1beta1.Node) []string {
	var out []string
	for _, st := range n.Status.DiskStatus {
		if st != nil && st.DiskUUID != "" {
			out = append(out, st.DiskUUID)
		}
	}
	slices.Sort(out)
	return out
}
