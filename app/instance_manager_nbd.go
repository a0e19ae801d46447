package app

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/engine/nbd"
	"github.com/strata-storage/strata/internal/unixsock"
)

// The instance manager's NBD frontend (issue 24): NBD carries no
// authentication, so volumes are served on a unix socket only the instance
// manager's own user (and root) may use, and on TCP only if asked, on
// loopback.

const nbdSocketUsage = "unix socket the NBD frontend serves volumes on (created 0600, its directory 0700 if missing); " +
	"only processes of the instance manager's user or root may connect. Engines' endpoints name it: " +
	"nbd+unix:///<volume>?socket=<path>"

const nbdListenUsage = "also serve NBD on this TCP address (host:port), for your own tools; loopback only " +
	"(127.0.0.0/8 or [::1]), since NBD over TCP has no authentication (STARTTLS is not implemented) and anyone " +
	"who can connect can read and write every attached volume. Empty (the default): no TCP. Endpoints stay nbd+unix"

// checkNBDListen refuses a --nbd-listen address that is not an IP
// literal on loopback: a host name could resolve elsewhere, an empty host
// listens on every interface.
func checkNBDListen(addr string) error {
	refuse := func(why string) error {
		return fmt.Errorf("--nbd-listen %q: %s; TCP exports are loopback-only (127.0.0.0/8 or [::1]) because NBD over TCP "+
			"carries no authentication (STARTTLS is not implemented): use the unix socket (--nbd-socket)", addr, why)
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return refuse(err.Error())
	}
	ip, err := netip.ParseAddr(host)
	switch {
	case host == "":
		return refuse("no host means every interface")
	case err != nil:
		return refuse("host must be an IP address, not a name")
	case !ip.Unmap().IsLoopback():
		return refuse(ip.String() + " is not a loopback address")
	}
	return nil
}

// nbdListeners opens the NBD frontend's listeners: the unix socket at
// socket (made absolute; the returned path is what endpoints name), with
// only the process's own uid and root let in, and a loopback TCP listener
// if tcp is not empty.
func nbdListeners(socket, tcp string, log logrus.FieldLogger) (string, []net.Listener, error) {
	if socket == "" {
		return "", nil, errors.New("--nbd-socket is required")
	}
	if tcp != "" {
		if err := checkNBDListen(tcp); err != nil {
			return "", nil, err
		}
	}
	abs, err := filepath.Abs(socket)
	if err != nil {
		return "", nil, fmt.Errorf("--nbd-socket %s: %w", socket, err)
	}
	ul, err := unixsock.Listen(abs, unixsock.Options{DirMode: 0o700, Mode: 0o600})
	if err != nil {
		return "", nil, fmt.Errorf("--nbd-socket: %w", err) // the error names the path
	}
	ls := []net.Listener{nbd.PeerUIDListener(ul, log, nbd.OwnUIDs()...)}
	if tcp != "" {
		tl, err := net.Listen("tcp", tcp)
		if err != nil {
			ul.Close()
			return "", nil, fmt.Errorf("--nbd-listen %s: %w", tcp, err)
		}
		ls = append(ls, tl)
	}
	return abs, ls, nil
}
