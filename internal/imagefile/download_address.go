package imagefile

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"time"
)

// RefusedRange is a range of addresses downloads may not reach, and what
// it is in the words of a refusal ("a Pod network address of the cluster").
type RefusedRange struct {
	Prefix netip.Prefix
	Class  string
}

// The classes refused by default, as a refusal names them.
const (
	classLoopback    = "a loopback address (this node's own services)"
	classLinkLocal   = "a link-local address (the cloud metadata endpoint lives there)"
	classPrivate     = "a private address (RFC 1918: the cluster's and the cloud's internal networks)"
	classShared      = "a shared address (RFC 6598, carrier-grade NAT: Alibaba Cloud's metadata endpoint is 100.100.100.200)"
	classUniqueLocal = "a unique-local IPv6 address (AWS's IPv6 metadata endpoint is fd00:ec2::254)"
	classMulticast   = "a multicast address"
)

// refusedByDefault is where a URL a user gives may not lead: the node
// itself, the cloud metadata endpoints, and the networks inside the
// cluster and its cloud, whose services trust whoever reaches them. An
// image server on such a network is reached through the policy's
// allowlist. The first range that holds an address names its class.
var refusedByDefault = []RefusedRange{
	{netip.MustParsePrefix("127.0.0.0/8"), classLoopback},
	{netip.MustParsePrefix("::1/128"), classLoopback},
	// "This network" and the unspecified address: a connect to 0.0.0.0
	// or :: reaches the node itself on Linux, like loopback.
	{netip.MustParsePrefix("0.0.0.0/8"), classLoopback},
	{netip.MustParsePrefix("::/128"), classLoopback},
	{netip.MustParsePrefix("169.254.0.0/16"), classLinkLocal},
	{netip.MustParsePrefix("fe80::/10"), classLinkLocal},
	{netip.MustParsePrefix("224.0.0.0/24"), classLinkLocal},
	{netip.MustParsePrefix("ff02::/16"), classLinkLocal},
	{netip.MustParsePrefix("10.0.0.0/8"), classPrivate},
	{netip.MustParsePrefix("172.16.0.0/12"), classPrivate},
	{netip.MustParsePrefix("192.168.0.0/16"), classPrivate},
	{netip.MustParsePrefix("100.64.0.0/10"), classShared},
	{netip.MustParsePrefix("fc00::/7"), classUniqueLocal},
	{netip.MustParsePrefix("224.0.0.0/4"), classMulticast},
	{netip.MustParsePrefix("ff00::/8"), classMulticast},
}

// nat64 is the well-known NAT64 prefix: 64:ff9b::a9fe:a9fe reaches
// 169.254.169.254 through a NAT64 gateway.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// dialContext dials address (a host name or an IP, and a port) with a
// dialer whose Control checks each address the name resolves to, on the
// socket before connect: a refused address sees no packet, and a name
// that resolves differently from one dial to the next (DNS rebinding, a
// redirect to the same host) is checked each time. The host name is kept
// for the allowlist of hosts, which DNS answers cannot name.
func (p DownloadPolicy) dialContext(ctx context.Context, network, address string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("dial address %q: %w", address, err)
	}
	dialer := &net.Dialer{Timeout: p.connectTimeout(), KeepAlive: 30 * time.Second, Resolver: p.resolver,
		Control: func(_, resolved string, _ syscall.RawConn) error { return p.checkDialAddress(host, resolved) }}
	return dialer.DialContext(ctx, network, address)
}

// checkDialAddress refuses a connection to address (the resolved IP and
// port) of host (the name dialled, or the same IP) when downloads may not
// reach it: an address in refusedByDefault or in the policy's Refused,
// unless the address is in Allowed or host in AllowedHosts. An IPv4 address
// mapped into IPv6 or behind the NAT64 prefix is judged as the IPv4
// address it reaches.
func (p DownloadPolicy) checkDialAddress(host, address string) error {
	if p.hostAllowed(host) {
		return nil
	}
	ipText, _, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("dial address %q: %w", address, err)
	}
	ip, err := netip.ParseAddr(ipText)
	if err != nil {
		return fmt.Errorf("dial address %q: not an IP address: %w", address, err)
	}
	ip = ip.WithZone("").Unmap() // a prefix never holds an address with a zone
	reached := ip
	if nat64.Contains(ip) {
		b := ip.As16()
		reached = netip.AddrFrom4([4]byte(b[12:]))
	}
	for _, allowed := range p.Allowed {
		if allowed.Contains(ip) || allowed.Contains(reached) {
			return nil
		}
	}
	class, refused := p.classOf(reached)
	if !refused {
		if class, refused = p.classOf(ip); !refused {
			return nil
		}
	}
	of := ""
	if host != ipText {
		of = " (" + host + ")"
	}
	allowedBy := p.AllowedBy
	if allowedBy == "" {
		allowedBy = "the download policy's allowlist"
	}
	return &addressRefusedError{msg: fmt.Sprintf("connecting to %s%s refused: %s; downloads reach it only when %s admits its address or host name",
		address, of, class, allowedBy)}
}

// classOf names the refused range that holds ip: the caller's first (they
// name this cluster's ranges more precisely than the defaults do).
func (p DownloadPolicy) classOf(ip netip.Addr) (string, bool) {
	for _, ranges := range [][]RefusedRange{p.Refused, refusedByDefault} {
		for _, r := range ranges {
			if r.Prefix.Contains(ip) {
				return r.Class, true
			}
		}
	}
	return "", false
}

// hostAllowed tells whether host is in AllowedHosts, in any case and with
// or without the final dot of a fully qualified name.
func (p DownloadPolicy) hostAllowed(host string) bool {
	host = strings.TrimSuffix(host, ".")
	for _, h := range p.AllowedHosts {
		if strings.EqualFold(host, strings.TrimSuffix(h, ".")) {
			return true
		}
	}
	return false
}
