package controller

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/internal/imagefile"
	"github.com/strata-storage/strata/types"
)

// backingImageLimitSettings bound what an image from outside may cost a
// node (issue 24). A copy refused by one of them failed for good; a change
// to any of them gives such copies one more try (see limitsChangedSince),
// or raising a cap would only help images created afterwards.
var backingImageLimitSettings = []types.SettingName{
	types.SettingBackingImageMaxVirtualSize,
	types.SettingBackingImageDownloadMaxSize,
	types.SettingBackingImageDownloadAllowLocal,
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
	allowLocal, err := ds.GetSettingBool(types.SettingBackingImageDownloadAllowLocal)
	if err != nil {
		return imagefile.DownloadPolicy{}, err
	}
	return imagefile.DownloadPolicy{MaxSize: gib << 30, AllowLoopback: allowLocal, AllowLinkLocal: allowLocal}, nil
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
		return types.SettingBackingImageDownloadAllowLocal
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

// noteLimitSettingsChanged records when a limit setting changed: copies
// that failed for good before then are tried once more.
func (j *fileJobs) noteLimitSettingsChanged(at time.Time) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.limitsChangedAt = at
}

// limitsChangedSince tells whether a limit setting changed at or after the
// copy's failure (its state's transition time, whole seconds: a failure in
// the same second as the change gets one more try, never one too few).
func (j *fileJobs) limitsChangedSince(failedAt string) bool {
	j.mu.Lock()
	changed := j.limitsChangedAt
	j.mu.Unlock()
	at, err := time.Parse(time.RFC3339, failedAt)
	return !changed.IsZero() && err == nil && !at.After(changed)
}
