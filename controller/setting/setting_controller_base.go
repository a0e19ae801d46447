package setting

import (
	"github.com/sirupsen/logrus"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// SettingController reports in each Setting's status whether its value is valid.
type SettingController struct {
	*kit.BaseController
}

// NewSettingController wires the setting controller to the Setting informer.
func NewSettingController(logger logrus.FieldLogger, ds *datastore.DataStore, recorder record.EventRecorder,
	controllerID string) (*SettingController, error) {
	sc := &SettingController{BaseController: kit.NewBaseController("strata-setting", controllerID, logger, ds, recorder)}
	sc.Sync = sc.syncSetting
	if err := sc.RequeueOnNodeReadyChange(sc.EnqueueEveryKey(ds.Settings.Informer())); err != nil {
		return nil, err
	}
	_, err := ds.Settings.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: sc.Enqueue,
		// Only a new value needs a verdict; status writes come back as updates too.
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.Setting) {
			if o.Value != n.Value || o.Status != n.Status {
				sc.Enqueue(n)
			}
		}),
	})
	return sc, err
}
