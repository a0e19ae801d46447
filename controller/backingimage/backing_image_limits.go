package backingimage

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/internal/imagefile"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// backingImageLimitSettings bound what an image from outside may cost a
// node (issue 24). A copy refused by one of them failed for good; a change
// of that setting's value gives it one more try (see limitSettingMoved),
// or raising a cap would only help images created afterwards.
var backingImageLimitSettings = []types.SettingName{
	types.SettingBackingImageMaxVirtualSize,
	types.SettingBackingImageDownloadMaxSize,
	types.SettingBackingImageDownloadAllowedNetworks,
}

func isBackingImageLimitSetting(name string) bool {
	return slices.Contains(backingImageLimitSettings, types.SettingName(name))
}

// imageLimits are the caps on preparing an image (a download or an upload).
func imageLimits(ds *datastore.DataStore) (imagefile.Limits, error) {
	gib, err := ds.GetSettingInt(types.SettingBackingImageMaxVirtualSize)
	if err != nil {
		return imagefile.Limits{}, err
	}
	return imagefile.Limits{MaxVirtualSize: gib << 30}, nil
}

// downloadPolicy is what a download from the image's URL may do; the
// timeouts are imagefile's defaults.
func downloadPolicy(ds *datastore.DataStore) (imagefile.DownloadPolicy, error) {
	gib, err := ds.GetSettingInt(types.SettingBackingImageDownloadMaxSize)
	if err != nil {
		return imagefile.DownloadPolicy{}, err
	}
	allowed, err := ds.GetSettingNetworks(types.SettingBackingImageDownloadAllowedNetworks)
	if err != nil {
		return imagefile.DownloadPolicy{}, err
	}
	return imagefile.DownloadPolicy{MaxSize: gib << 30, Allowed: allowed.Prefixes, AllowedHosts: allowed.Hosts,
		AllowedBy: "the setting " + string(types.SettingBackingImageDownloadAllowedNetworks)}, nil
}

// limitSetting names the setting a refusal depends on ("" for none).
func limitSetting(err error) types.SettingName {
	var le *imagefile.LimitError
	switch {
	case errors.As(err, &le) && le.Limit == imagefile.LimitDownloadSize:
		return types.SettingBackingImageDownloadMaxSize
	case errors.As(err, &le):
		return types.SettingBackingImageMaxVirtualSize
	case errors.Is(err, imagefile.ErrAddressRefused):
		return types.SettingBackingImageDownloadAllowedNetworks
	}
	return ""
}

// notRetriedHint ends the message of a copy that failed for good: what
// would make it go, the setting that refused it included.
func notRetriedHint(kind string, err error) string {
	name := limitSetting(err)
	switch {
	case kind == jobUploading && name != "":
		return fmt.Sprintf("%s, or raise the setting %s", notRetriedUpload, name)
	case kind == jobUploading:
		return notRetriedUpload
	case name != "":
		return fmt.Sprintf("not retried until the image's spec or the setting %s changes", name)
	}
	return notRetried
}

// noteLimitSettingChanged records that a limit setting's value changed:
// a transfer it refused that had started before cannot be held for good
// (it may have run with the old value).
func (j *fileJobs) noteLimitSettingChanged(name types.SettingName) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.limitChangedAt[name] = time.Now()
}

// limitChangedSince tells whether the setting changed after start (both
// on this process's monotonic clock, so no rounding can hide a change).
func (j *fileJobs) limitChangedSince(name types.SettingName, start time.Time) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.limitChangedAt[name].After(start)
}

// limitSettingMoved tells whether the setting that refused a copy for good
// has another value now than when it refused it: then the copy is tried
// again. It reads the cache (no API call).
func limitSettingMoved(ds *datastore.DataStore, st *v1beta1.BackingImageDiskFileStatus) bool {
	if st.FailedSetting == "" {
		return false
	}
	if _, known := types.SettingDefinitions[types.SettingName(st.FailedSetting)]; !known {
		// A setting since removed (backing-image-download-allow-local-addresses,
		// replaced by backing-image-download-allowed-networks): tried again
		// under today's settings, or no change of them would free the copy.
		return true
	}
	value, err := ds.GetSettingValue(types.SettingName(st.FailedSetting))
	return err == nil && value != st.FailedSettingValue
}
