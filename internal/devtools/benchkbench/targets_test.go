package benchkbench

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNBDSocket(t *testing.T) {
	for _, tc := range []struct {
		endpoint, socket, err string
	}{
		{"nbd+unix:///kbench-raw-1r?socket=/var/lib/strata/nbd/im.sock", "/var/lib/strata/nbd/im.sock", ""},
		{"nbd://127.0.0.1:10809/v", "", "want nbd+unix"},
		{"nbd+unix:///v?socket=im.sock", "", "want nbd+unix"},
		{"nbd+unix:///v", "", "want nbd+unix"},
		{"%zz", "", "frontend endpoint"},
	} {
		t.Run(tc.endpoint, func(t *testing.T) {
			got, err := nbdSocket(tc.endpoint)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.socket, got)
		})
	}
}
