package types

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
)

// Networks is the value of a SettingTypeNetworks setting.
type Networks struct {
	// Prefixes are the CIDRs, and the bare IP addresses as /32 or /128.
	Prefixes []netip.Prefix
	// Hosts are the host names, in lower case, without a final dot.
	Hosts []string
}

// hostLabelRE is one label of a host name (RFC 1123), in lower case.
var hostLabelRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ParseNetworks reads a comma-separated list of CIDRs (10.0.0.0/8,
// fd00::/8), IP addresses and host names; blanks around an entry and empty
// entries are ignored. A CIDR with host bits set means its network.
func ParseNetworks(value string) (Networks, error) {
	var n Networks
	for _, entry := range strings.Split(value, ",") {
		entry = strings.TrimSpace(entry)
		switch {
		case entry == "":
		case strings.Contains(entry, "/"):
			p, err := netip.ParsePrefix(entry)
			if err != nil {
				return Networks{}, fmt.Errorf("entry %q is not a CIDR: %w", entry, err)
			}
			n.Prefixes = append(n.Prefixes, p.Masked())
		default:
			if ip, err := netip.ParseAddr(entry); err == nil {
				if ip.Zone() != "" {
					return Networks{}, fmt.Errorf("entry %q: an address with a zone cannot be allowed; give it without %%%s", entry, ip.Zone())
				}
				ip = ip.Unmap()
				n.Prefixes = append(n.Prefixes, netip.PrefixFrom(ip, ip.BitLen()))
				continue
			}
			host := strings.ToLower(strings.TrimSuffix(entry, "."))
			if !isHostName(host) {
				return Networks{}, fmt.Errorf("entry %q is neither a CIDR, an IP address nor a host name", entry)
			}
			n.Hosts = append(n.Hosts, host)
		}
	}
	return n, nil
}

// isHostName tells whether host (lower case) is a DNS host name. Its last
// label is not all digits (RFC 3696), so a mistyped address such as
// 10.0.0.300 is no name.
func isHostName(host string) bool {
	if host == "" || len(host) > 253 {
		return false
	}
	labels := strings.Split(host, ".")
	for _, l := range labels {
		if !hostLabelRE.MatchString(l) {
			return false
		}
	}
	return strings.Trim(labels[len(labels)-1], "0123456789") != ""
}
