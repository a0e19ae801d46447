package nbddev

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValidateEndpoint(t *testing.T) {
	for _, ok := range []string{
		"nbd+unix:///pvc-1?socket=/var/lib/strata/im-nbd/nbd.sock",
		"nbd://127.0.0.1:10809/pvc-1", // recorded by an older plugin, or an older instance manager's
	} {
		assert.NoError(t, validateEndpoint(ok), ok)
	}
	for _, bad := range []string{
		"", "/dev/nbd0", "nbd+unix:///pvc-1", "nbd+unix:///pvc-1?socket=nbd.sock", "nbd+unix:///pvc-1?socket=/a/../b",
		"nbds://127.0.0.1:10809/pvc-1", "nbd+unix://host/pvc-1?socket=/run/nbd.sock", "nbd://127.0.0.1:10809/",
	} {
		err := validateEndpoint(bad)
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), "want nbd+unix:///<export>?socket=<absolute path> or nbd://<host>:<port>/<export>")
	}
}

// nbdfuse reads the growable export of the endpoint; a lost record is
// rebuilt from nbdfuse's command line by taking the suffix off again.
func TestExportSuffix(t *testing.T) {
	tests := []struct{ endpoint, growable string }{
		{"nbd+unix:///pvc-1?socket=/run/strata/nbd.sock", "nbd+unix:///pvc-1+growable?socket=/run/strata/nbd.sock"},
		{"nbd://127.0.0.1:10809/pvc-1", "nbd://127.0.0.1:10809/pvc-1+growable"},
	}
	for _, tt := range tests {
		got, err := withExportSuffix(tt.endpoint, "+growable")
		require.NoError(t, err)
		assert.Equal(t, tt.growable, got)
		assert.Equal(t, tt.endpoint, withoutExportSuffix(got, "+growable"))
		assert.Equal(t, tt.endpoint, withoutExportSuffix(tt.endpoint, "+growable"), "no suffix: unchanged")
	}
	_, err := withExportSuffix("tcp://h/v", "+growable")
	require.Error(t, err)
	assert.Equal(t, "garbage", withoutExportSuffix("garbage", "+growable"))
}
