package csi

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// dataLocality is taken as the volume's spec.dataLocality; any other value
// is refused, naming the parameter and the values it takes.
func TestParseParametersDataLocality(t *testing.T) {
	tests := []struct {
		value   string
		want    v1beta1.DataLocality
		wantErr string
	}{
		{value: "best-effort", want: v1beta1.DataLocalityBestEffort},
		{value: "disabled", want: v1beta1.DataLocalityDisabled},
		{value: "strict-local", wantErr: `parameter dataLocality="strict-local": must be disabled or best-effort`},
		{value: "", wantErr: `parameter dataLocality="": must be disabled or best-effort`},
	}
	for _, tc := range tests {
		t.Run(tc.value, func(t *testing.T) {
			p, err := parseParameters(map[string]string{ParamDataLocality: tc.value}, map[string]string{})
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Equal(t, codes.InvalidArgument, status.Code(err))
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, p.dataLocality)
		})
	}
}

// freezeFilesystemForSnapshot is taken as the volume's field of that name;
// csi.storage.k8s.io/fstype is csi-provisioner's and never reaches the
// driver, but a class's other provisioner keys are let through.
func TestParseParametersFreezeFilesystem(t *testing.T) {
	tests := []struct {
		value   string
		want    v1beta1.FreezeFilesystem
		wantErr string
	}{
		{value: "enabled", want: v1beta1.FreezeFilesystemEnabled},
		{value: "disabled", want: v1beta1.FreezeFilesystemDisabled},
		{value: "ignored", want: v1beta1.FreezeFilesystemIgnored},
		{value: "off", wantErr: `parameter freezeFilesystemForSnapshot="off": must be enabled, disabled or ignored`},
	}
	for _, tc := range tests {
		t.Run(tc.value, func(t *testing.T) {
			p, err := parseParameters(map[string]string{ParamFreezeFilesystem: tc.value}, map[string]string{})
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Equal(t, codes.InvalidArgument, status.Code(err))
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, p.freezeFilesystem)
		})
	}
}
