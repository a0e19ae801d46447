package engineapi

import (
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"strings"

	"github.com/strata-storage/strata/internal/unixsock"
)

// NBDEndpoint is an engine's frontend endpoint, an NBD URI of one of the
// two forms Strata accepts (https://github.com/NetworkBlockDevice/nbd/blob/master/doc/uri.md):
//
//	nbd+unix:///<export>?socket=<absolute path>   what instance managers publish
//	nbd://<host>[:<port>]/<export>                  a TCP export (endpoints of older instance managers)
//
// qemu (qemu-io, qemu-img, qemu-nbd --connect) and libnbd (nbdfuse, nbdinfo,
// nbdcopy, fio's nbd engine) take both.
type NBDEndpoint struct {
	// Export is the export's name (the volume's, or with
	// GrowableExportSuffix its growable export's).
	Export string
	// Socket is the unix socket of an nbd+unix endpoint; "" for nbd://.
	Socket string
	// Host is host[:port] of an nbd:// endpoint; "" for nbd+unix.
	Host string
}

// UnixNBDEndpoint is the endpoint of export served on the unix socket at
// socket (an absolute path).
func UnixNBDEndpoint(socket, export string) NBDEndpoint {
	return NBDEndpoint{Export: export, Socket: socket}
}

// WithExport is the same server's export name.
func (e NBDEndpoint) WithExport(name string) NBDEndpoint {
	e.Export = name
	return e
}

// String is the URI. For an endpoint ParseNBDEndpoint returned,
// String gives back what was parsed when that was written as String
// writes (the instance manager's endpoints are), so endpoints compare as
// strings.
func (e NBDEndpoint) String() string {
	if e.Socket != "" {
		return "nbd+unix:///" + escapeURIPart(e.Export, "/+") + "?socket=" + escapeURIPart(e.Socket, "/")
	}
	return "nbd://" + e.Host + "/" + escapeURIPart(e.Export, "/+")
}

// escapeURIPart percent-encodes every byte of s but RFC 3986's unreserved
// characters and keep. Query values are decoded by qemu and libnbd as RFC
// 3986 says, not as HTML forms ('+' is not a space), so a '+' in a socket
// path is encoded; in the export (a URI path) it is kept, as in
// "pvc-1+growable".
func escapeURIPart(s, keep string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			strings.IndexByte("-._~", c) >= 0 || strings.IndexByte(keep, c) >= 0 {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

// ParseNBDEndpoint parses an endpoint of one of the two forms NBDEndpoint
// describes and refuses anything else: another scheme, no export, a user,
// a fragment, query parameters other than nbd+unix's one socket (nbd:// has
// none), or a socket path that is relative, has a ".." element or is too
// long for a unix socket.
func ParseNBDEndpoint(endpoint string) (NBDEndpoint, error) {
	bad := func(format string, args ...any) (NBDEndpoint, error) {
		return NBDEndpoint{}, fmt.Errorf("endpoint %q: %s (want nbd+unix:///<export>?socket=<absolute path> or nbd://<host>:<port>/<export>)",
			endpoint, fmt.Sprintf(format, args...))
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return bad("not a URI: %v", err)
	}
	if u.Opaque != "" || u.User != nil || u.Fragment != "" || u.RawFragment != "" || strings.Contains(endpoint, "#") {
		return bad("a user, a fragment or a path without // is not allowed")
	}
	export := strings.TrimPrefix(u.Path, "/")
	if !strings.HasPrefix(u.Path, "/") || export == "" {
		return bad("no export name")
	}
	switch u.Scheme {
	case "nbd+unix":
		if u.Host != "" {
			return bad("nbd+unix takes no host (the socket names the server)")
		}
		socket, err := unixSocketParam(u.RawQuery)
		if err != nil {
			return bad("%v", err)
		}
		return NBDEndpoint{Export: export, Socket: socket}, nil
	case "nbd":
		if u.Host == "" || u.Hostname() == "" {
			return bad("no host")
		}
		if u.RawQuery != "" || u.ForceQuery {
			return bad("nbd:// takes no query parameters")
		}
		return NBDEndpoint{Export: export, Host: u.Host}, nil
	default:
		return bad("scheme %q is not nbd+unix or nbd", u.Scheme)
	}
}

// unixSocketParam is the socket of an nbd+unix query: exactly one
// parameter, socket, an absolute path without "..". Values are decoded as
// RFC 3986 says (qemu and libnbd do), so '+' is a plus, not a space.
func unixSocketParam(rawQuery string) (string, error) {
	if rawQuery == "" {
		return "", fmt.Errorf("nbd+unix needs ?socket=<absolute path>")
	}
	params := strings.Split(rawQuery, "&")
	key, value, _ := strings.Cut(params[0], "=")
	if len(params) != 1 || key != "socket" {
		return "", fmt.Errorf("nbd+unix takes exactly one query parameter, socket")
	}
	socket, err := url.PathUnescape(value)
	switch {
	case err != nil:
		return "", fmt.Errorf("socket: %v", err)
	case !filepath.IsAbs(socket):
		return "", fmt.Errorf("socket %q must be an absolute path", socket)
	case slices.Contains(strings.Split(socket, "/"), ".."):
		return "", fmt.Errorf("socket %q must not contain ..", socket)
	case strings.ContainsRune(socket, 0):
		return "", fmt.Errorf("socket %q contains a NUL byte", socket)
	case len(socket) > unixsock.MaxPath:
		return "", fmt.Errorf("socket %q is %d bytes, over the %d a unix socket path may have", socket, len(socket), unixsock.MaxPath)
	}
	return socket, nil
}
