package webhook

// The webhook's serving certificate: one per manager, signed by Strata's CA
// signer at the manager keeper's request (internal/pki Keeper.Webhook).

import (
	"net"
	"slices"

	"github.com/strata-storage/strata/internal/pki"
)

// ServingHosts are the names a manager's serving certificate is valid for:
// loopback, the listen and URL hosts (local mode), and the Service's DNS
// names (package mode).
func ServingHosts(namespace string, extra ...string) []string {
	hosts := append([]string{"127.0.0.1", "localhost"}, pki.ServiceDNSNames(ServiceName, namespace)...)
	for _, h := range extra {
		if ip := net.ParseIP(h); h == "" || (ip != nil && ip.IsUnspecified()) || slices.Contains(hosts, h) {
			continue
		}
		hosts = append(hosts, h)
	}
	return hosts
}
