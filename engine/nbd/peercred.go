package nbd

import (
	"fmt"
	"net"
	"os"
	"slices"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// NBD has no authentication of its own (only TLS, which Strata does not
// implement). On a unix socket the kernel tells who connected: a
// PeerUIDListener lets only the given users' processes through.

// peerUIDListener is the listener PeerUIDListener returns.
type peerUIDListener struct {
	net.Listener
	allowed []uint32
	log     logrus.FieldLogger
}

// OwnUIDs are the users allowed on the instance manager's NBD socket: the
// process's own, and root.
func OwnUIDs() []uint32 {
	uids := []uint32{uint32(os.Getuid())}
	if uids[0] != 0 {
		uids = append(uids, 0)
	}
	return uids
}

// PeerUIDListener wraps a unix socket listener so that Accept returns only
// connections from processes whose uid is in allowed, as SO_PEERCRED says
// (the credentials of the process that connected, fixed at connect).
// Anything else is closed at once and logged at warning with the peer's
// uid and pid; Accept goes on to the next connection.
func PeerUIDListener(l net.Listener, log logrus.FieldLogger, allowed ...uint32) net.Listener {
	return &peerUIDListener{Listener: l, allowed: slices.Clone(allowed),
		log: log.WithFields(logrus.Fields{"component": "nbd", "listen": l.Addr().String()})}
}

func (l *peerUIDListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		cred, err := unixPeerCred(c)
		if err != nil {
			l.log.WithError(err).Warn("Refused an NBD connection: cannot read its peer credentials")
			c.Close()
			continue
		}
		if slices.Contains(l.allowed, cred.Uid) {
			// A unix client's address is empty ("@"): logs name the process.
			return peerConn{Conn: c, addr: peerAddr(fmt.Sprintf("pid=%d,uid=%d", cred.Pid, cred.Uid))}, nil
		}
		l.log.WithFields(logrus.Fields{"uid": cred.Uid, "gid": cred.Gid, "pid": cred.Pid, "allowedUIDs": l.allowed}).
			Warn("Refused an NBD connection from a user not allowed on this socket")
		c.Close()
	}
}

// peerConn is an accepted connection whose RemoteAddr names the peer
// process, as SO_PEERCRED told it.
type peerConn struct {
	net.Conn
	addr peerAddr
}

func (c peerConn) RemoteAddr() net.Addr { return c.addr }

type peerAddr string

func (peerAddr) Network() string  { return "unix" }
func (a peerAddr) String() string { return string(a) }

// unixPeerCred reads SO_PEERCRED of a unix socket connection.
func unixPeerCred(c net.Conn) (*unix.Ucred, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil, fmt.Errorf("%T is not a unix socket connection", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if credErr != nil {
		return nil, fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	return cred, nil
}
