package setting

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/types"
)

// EventReasonInvalidSetting is recorded when a setting's value is rejected.
const EventReasonInvalidSetting = "InvalidSetting"

// syncSetting checks a setting's value against its definition and reports
// the verdict in status, so an admin sees a bad value at once: readers of
// the setting refuse it (GetSettingInt and friends) rather than guess.
func (sc *SettingController) syncSetting(ctx context.Context, key string) error {
	name, err := kit.NameFromKey(key)
	if err != nil {
		return err
	}
	settingRO, err := sc.DS.Settings.GetRO(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	// Settings have no owner node; any one alive manager reports on each.
	if responsible, err := sc.IsResponsibleFor(key, "", ""); err != nil || !responsible {
		return err
	}

	setting := settingRO.DeepCopy()
	setting.Status.Applied, setting.Status.Message = true, ""
	if err := types.ValidateSetting(types.SettingName(name), setting.Value); err != nil {
		setting.Status.Applied, setting.Status.Message = false, err.Error()
	}
	if setting.Status == settingRO.Status {
		return nil
	}
	updated, err := sc.DS.Settings.UpdateStatus(ctx, setting)
	if err != nil {
		return err
	}
	if !updated.Status.Applied {
		sc.Logger.WithField("setting", name).Warn("Setting rejected: " + updated.Status.Message)
		sc.Recorder.Event(updated, corev1.EventTypeWarning, EventReasonInvalidSetting, updated.Status.Message)
	}
	return nil
}
