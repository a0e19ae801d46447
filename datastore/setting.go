package datastore

import (
	"context"
	"fmt"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// EnsureDefaultSettings creates, with its default value, every known setting
// the cache does not hold. Call it after the cache has synced. Managers start
// together, so a setting another manager created first is not an error.
func (ds *DataStore) EnsureDefaultSettings(ctx context.Context) (created []types.SettingName, err error) {
	for _, name := range types.SettingNames() {
		if _, err := ds.Settings.GetRO(string(name)); err == nil {
			continue
		} else if !apierrors.IsNotFound(err) {
			return created, err
		}
		setting := &v1beta1.Setting{
			ObjectMeta: metav1.ObjectMeta{Name: string(name), Namespace: ds.Namespace},
			Value:      types.SettingDefinitions[name].Default,
		}
		if _, err := ds.Settings.Create(ctx, setting); err != nil && !apierrors.IsAlreadyExists(err) {
			return created, fmt.Errorf("creating setting %s: %w", name, err)
		}
		created = append(created, name)
	}
	return created, nil
}

// GetSettingValue returns a setting's cached value, or its default while the
// Setting CR does not exist yet.
func (ds *DataStore) GetSettingValue(name types.SettingName) (string, error) {
	def, ok := types.SettingDefinitions[name]
	if !ok {
		return "", fmt.Errorf("unknown setting %q", name)
	}
	setting, err := ds.Settings.GetRO(string(name))
	if apierrors.IsNotFound(err) {
		return def.Default, nil
	}
	if err != nil {
		return "", err
	}
	return setting.Value, nil
}

// GetSettingInt returns an int setting; a stored value that does not parse
// is an error naming the setting, never a silent default.
func (ds *DataStore) GetSettingInt(name types.SettingName) (int64, error) {
	value, err := ds.GetSettingValue(name)
	if err != nil {
		return 0, err
	}
	if err := types.ValidateSetting(name, value); err != nil {
		return 0, err
	}
	return strconv.ParseInt(value, 10, 64)
}

// GetSettingBool returns a bool setting, with the same rules as GetSettingInt.
func (ds *DataStore) GetSettingBool(name types.SettingName) (bool, error) {
	value, err := ds.GetSettingValue(name)
	if err != nil {
		return false, err
	}
	if err := types.ValidateSetting(name, value); err != nil {
		return false, err
	}
	return strconv.ParseBool(value)
}

// GetSettingNetworks returns a list of networks and host names, with the
// same rules as GetSettingInt.
func (ds *DataStore) GetSettingNetworks(name types.SettingName) (types.Networks, error) {
	value, err := ds.GetSettingValue(name)
	if err != nil {
		return types.Networks{}, err
	}
	if err := types.ValidateSetting(name, value); err != nil {
		return types.Networks{}, err
	}
	return types.ParseNetworks(value)
}
