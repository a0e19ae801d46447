package backingimage

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/internal/imagefile"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// clusterObjects are two Kubernetes Nodes (one on public addresses, as
// some clouds give) and the cluster's ServiceCIDR.
func clusterObjects() []runtime.Object {
	node := func(name string, podCIDRs []string, addrs ...corev1.NodeAddress) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDRs: podCIDRs},
			Status: corev1.NodeStatus{Addresses: addrs}}
	}
	return []runtime.Object{
		node("node-1", []string{"10.244.0.0/24", "fd00:10:244::/64"},
			corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.0.0.11"},
			corev1.NodeAddress{Type: corev1.NodeHostName, Address: "node-1"}),
		node("node-2", []string{"198.18.1.0/24"},
			corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "203.0.113.12"},
			corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "2001:db8::12"},
			corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "127.0.0.2"}), // the local cluster's
		&networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
			Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"198.51.100.0/24", "fd00:10:96::/112"}}},
	}
}

// thisNode stands in for net.InterfaceAddrs: loopback, a link-local and a
// public address.
func thisNode() ([]net.Addr, error) {
	var out []net.Addr
	for _, cidr := range []string{"127.0.0.1/8", "::1/128", "fe80::1/64", "192.0.2.5/24"} {
		ip, ipNet, err := net.ParseCIDR(cidr)
		if err != nil {
			return nil, err
		}
		out = append(out, &net.IPNet{IP: ip, Mask: ipNet.Mask})
	}
	return out, nil
}

// The cluster's own ranges, from the cache: this node's interfaces, every
// Node's internal and external addresses and Pod ranges, the Service
// ranges. Loopback and link-local stay with imagefile's defaults.
func TestClusterRanges(t *testing.T) {
	env := dstest.New(t, nil, clusterObjects())
	got, err := clusterRanges(env.DS, thisNode)
	require.NoError(t, err)
	r := func(cidr, class string) imagefile.RefusedRange {
		return imagefile.RefusedRange{Prefix: netip.MustParsePrefix(cidr), Class: class}
	}
	assert.ElementsMatch(t, []imagefile.RefusedRange{
		r("192.0.2.5/32", "an address of this node"),
		r("10.0.0.11/32", "an address of the node node-1"),
		r("203.0.113.12/32", "an address of the node node-2"),
		r("2001:db8::12/128", "an address of the node node-2"),
		r("10.244.0.0/24", "a Pod network address of the cluster"),
		r("fd00:10:244::/64", "a Pod network address of the cluster"),
		r("198.18.1.0/24", "a Pod network address of the cluster"),
		r("198.51.100.0/24", "a Service address of the cluster"),
		r("fd00:10:96::/112", "a Service address of the cluster"),
	}, got)

	_, err = clusterRanges(env.DS, func() ([]net.Addr, error) { return nil, errors.New("netlink: no") })
	require.ErrorContains(t, err, "listing this node's addresses, which downloads may not reach: netlink: no")
}

// A download to one of the cluster's addresses on public ranges is refused
// at dial time, saying which address it is and which setting admits it;
// the setting admits it.
func TestDownloadPolicyRefusesClusterAddresses(t *testing.T) {
	setting := func(value string) *v1beta1.Setting {
		return &v1beta1.Setting{ObjectMeta: metav1.ObjectMeta{Name: string(types.SettingBackingImageDownloadAllowedNetworks),
			Namespace: fixture.NS}, Value: value}
	}
	tests := []struct {
		name, allowed, url string
		wantErr            string // "": the dial goes out
	}{
		{name: "a node's public address", url: "http://203.0.113.12:1/img",
			wantErr: "connecting to 203.0.113.12:1 refused: an address of the node node-2"},
		{name: "a Pod on a public range", url: "http://198.18.1.7:1/img",
			wantErr: "connecting to 198.18.1.7:1 refused: a Pod network address of the cluster"},
		{name: "a Service", url: "http://198.51.100.10:1/img",
			wantErr: "connecting to 198.51.100.10:1 refused: a Service address of the cluster"},
		{name: "a private Pod range", url: "http://10.244.0.9:1/img",
			wantErr: "connecting to 10.244.0.9:1 refused: a Pod network address of the cluster"},
		{name: "loopback, named by the defaults", url: "http://127.0.0.2:1/img",
			wantErr: "connecting to 127.0.0.2:1 refused: a loopback address"},
		{name: "loopback allowed", allowed: "127.0.0.0/8", url: "http://127.0.0.2:1/img"},
		{name: "a bad setting", allowed: "10.0.0.0/40", url: "http://127.0.0.2:1/img",
			wantErr: `setting backing-image-download-allowed-networks: entry "10.0.0.0/40" is not a CIDR`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := dstest.New(t, []runtime.Object{setting(tc.allowed)}, clusterObjects())
			policy, err := downloadPolicy(env.DS)
			if err == nil {
				policy.ConnectTimeout = time.Second // should a refusal fail, the test fails fast
				_, err = imagefile.Download(context.Background(), policy, tc.url, t.TempDir()+"/part", nil)
			}
			if tc.wantErr == "" {
				require.Error(t, err)
				assert.NotErrorIs(t, err, imagefile.ErrAddressRefused)
				assert.ErrorContains(t, err, "connection refused", "dialled: nothing listens on port 1")
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
			if errors.Is(err, imagefile.ErrAddressRefused) {
				assert.ErrorContains(t, err, "downloads reach it only when the setting backing-image-download-allowed-networks admits")
			}
		})
	}
}
