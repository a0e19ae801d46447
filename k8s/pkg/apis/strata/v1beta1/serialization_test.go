package v1beta1_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// A rejected setting shows APPLIED false in kubectl get setting: the printer
// column reads status.applied, which must be written even when false.
func TestSettingAppliedFalseIsWritten(t *testing.T) {
	b, err := json.Marshal(v1beta1.Setting{Value: "lots", Status: v1beta1.SettingStatus{Message: "not an integer"}})
	require.NoError(t, err)
	assert.Contains(t, string(b), `"applied":false`)
}
