// Package unixsock listens on unix sockets the way Strata's daemons do: a
// socket file left by a process that was killed is replaced, one a live
// process answers on is not.
package unixsock

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"
)

// MaxPath is the longest path a unix socket may have on Linux (sun_path is
// 108 bytes with its terminating NUL).
const MaxPath = 107

// Options say how the socket and its directory are made.
type Options struct {
	// DirMode is the mode the socket's directory (and any missing parent)
	// is created with if missing; an existing one is left as it is.
	DirMode os.FileMode
	// Mode, if not 0, is set on the socket file after it is created
	// (before any connection is accepted; the directory's mode is what
	// keeps others from connecting in between).
	Mode os.FileMode
}

// Listen listens on a unix socket at path. A socket file there that
// nothing answers on (left by a killed process) is replaced; one something
// answers on, or a file that is not a socket, is an error. The listener
// removes the socket file when closed.
func Listen(path string, opts Options) (*net.UnixListener, error) {
	if len(path) > MaxPath {
		return nil, fmt.Errorf("socket %s is %d bytes, over the %d a unix socket path may have: use a shorter path",
			path, len(path), MaxPath)
	}
	if err := os.MkdirAll(filepath.Dir(path), opts.DirMode); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if conn, err := net.DialTimeout("unix", path, time.Second); err == nil {
			conn.Close()
			return nil, fmt.Errorf("%s: another process serves this socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, err
		}
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	if opts.Mode != 0 {
		if err := os.Chmod(path, opts.Mode); err != nil {
			l.Close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return l, nil
}
