package engineapi

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseNBDEndpoint(t *testing.T) {
	tests := []struct {
		name     string
		endpoint string
		want     NBDEndpoint
		wantMsg  string // empty: valid
	}{
		{"unix", "nbd+unix:///pvc-1?socket=/var/lib/strata/im-nbd/nbd.sock",
			NBDEndpoint{Export: "pvc-1", Socket: "/var/lib/strata/im-nbd/nbd.sock"}, ""},
		{"unix, growable export", "nbd+unix:///pvc-1+growable?socket=/run/nbd.sock",
			NBDEndpoint{Export: "pvc-1+growable", Socket: "/run/nbd.sock"}, ""},
		{"unix, escaped socket", "nbd+unix:///v?socket=/run/a%20b%2Bc.sock", NBDEndpoint{Export: "v", Socket: "/run/a b+c.sock"}, ""},
		{"unix, escaped slashes", "nbd+unix:///v?socket=%2Frun%2Fnbd.sock", NBDEndpoint{Export: "v", Socket: "/run/nbd.sock"}, ""},
		{"tcp", "nbd://127.0.0.1:10809/pvc-1", NBDEndpoint{Export: "pvc-1", Host: "127.0.0.1:10809"}, ""},
		{"tcp, default port", "nbd://h/v", NBDEndpoint{Export: "v", Host: "h"}, ""},
		{"tcp, IPv6", "nbd://[::1]:10809/v", NBDEndpoint{Export: "v", Host: "[::1]:10809"}, ""},

		{"empty", "", NBDEndpoint{}, "no export name"},
		{"a path", "/dev/nbd0", NBDEndpoint{}, `scheme "" is not nbd+unix or nbd`},
		{"http", "http://127.0.0.1:10809/v", NBDEndpoint{}, `scheme "http"`},
		{"tls", "nbds://127.0.0.1:10809/v", NBDEndpoint{}, `scheme "nbds"`},
		{"unix tls", "nbds+unix:///v?socket=/run/nbd.sock", NBDEndpoint{}, `scheme "nbds+unix"`},
		{"vsock", "nbd+vsock://2:10809/v", NBDEndpoint{}, `scheme "nbd+vsock"`},
		{"unix, no socket", "nbd+unix:///v", NBDEndpoint{}, "needs ?socket="},
		{"unix, empty socket", "nbd+unix:///v?socket=", NBDEndpoint{}, "must be an absolute path"},
		{"unix, relative socket", "nbd+unix:///v?socket=run/nbd.sock", NBDEndpoint{}, `socket "run/nbd.sock" must be an absolute path`},
		{"unix, dot-dot", "nbd+unix:///v?socket=/run/../etc/nbd.sock", NBDEndpoint{}, "must not contain .."},
		{"unix, escaped dot-dot", "nbd+unix:///v?socket=/run/%2E%2E/nbd.sock", NBDEndpoint{}, "must not contain .."},
		{"unix, too long", "nbd+unix:///v?socket=/" + strings.Repeat("a", 107), NBDEndpoint{}, "over the 107"},
		{"unix, another parameter", "nbd+unix:///v?socket=/run/nbd.sock&tls-certificates=/x", NBDEndpoint{}, "exactly one query parameter"},
		{"unix, another parameter only", "nbd+unix:///v?sock=/run/nbd.sock", NBDEndpoint{}, "exactly one query parameter"},
		{"unix, twice", "nbd+unix:///v?socket=/a&socket=/b", NBDEndpoint{}, "exactly one query parameter"},
		{"unix, bad escape", "nbd+unix:///v?socket=/run/%zz", NBDEndpoint{}, `socket: invalid URL escape "%zz"`},
		{"bad escape in the export", "nbd+unix:///v%zz?socket=/run/nbd.sock", NBDEndpoint{}, "not a URI"},
		{"unix, a host", "nbd+unix://h/v?socket=/run/nbd.sock", NBDEndpoint{}, "takes no host"},
		{"unix, no export", "nbd+unix:///?socket=/run/nbd.sock", NBDEndpoint{}, "no export name"},
		{"unix, no slashes", "nbd+unix:v?socket=/run/nbd.sock", NBDEndpoint{}, "path without //"},
		{"unix, a fragment", "nbd+unix:///v?socket=/run/nbd.sock#x", NBDEndpoint{}, "fragment"},
		{"unix, an empty fragment", "nbd+unix:///v?socket=/run/nbd.sock#", NBDEndpoint{}, "fragment"},
		{"tcp, no export", "nbd://127.0.0.1:1/", NBDEndpoint{}, "no export name"},
		{"tcp, no host", "nbd:///a", NBDEndpoint{}, "no host"},
		{"tcp, port only", "nbd://:10809/a", NBDEndpoint{}, "no host"},
		{"tcp, a query", "nbd://127.0.0.1:1/a?socket=/run/nbd.sock", NBDEndpoint{}, "nbd:// takes no query"},
		{"tcp, a user", "nbd://me@127.0.0.1:1/a", NBDEndpoint{}, "a user"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseNBDEndpoint(tt.endpoint)
			if tt.wantMsg != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantMsg)
				assert.Contains(t, err.Error(), "want nbd+unix:///<export>?socket=<absolute path> or nbd://<host>:<port>/<export>")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// What the instance manager publishes parses back to itself, so endpoints
// compare as strings (csi/nbddev records them); the growable export is the
// same URI with another export name.
func TestNBDEndpointString(t *testing.T) {
	tests := []struct {
		ep   NBDEndpoint
		want string
	}{
		{UnixNBDEndpoint("/var/lib/strata/im-nbd/nbd.sock", "pvc-1"), "nbd+unix:///pvc-1?socket=/var/lib/strata/im-nbd/nbd.sock"},
		{UnixNBDEndpoint("/run/nbd.sock", "pvc-1").WithExport("pvc-1" + GrowableExportSuffix),
			"nbd+unix:///pvc-1+growable?socket=/run/nbd.sock"},
		{UnixNBDEndpoint("/run/a b+c&d=e?f#g%.sock", "v"), "nbd+unix:///v?socket=/run/a%20b%2Bc%26d%3De%3Ff%23g%25.sock"},
		{UnixNBDEndpoint("/run/nbd.sock", "a?b#c"), "nbd+unix:///a%3Fb%23c?socket=/run/nbd.sock"},
		{NBDEndpoint{Host: "127.0.0.1:10809", Export: "pvc-1"}, "nbd://127.0.0.1:10809/pvc-1"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.ep.String())
			back, err := ParseNBDEndpoint(tt.want)
			require.NoError(t, err)
			assert.Equal(t, tt.ep, back)
		})
	}
}
