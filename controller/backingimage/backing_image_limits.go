package backingimage

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/internal/imagefile"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// backingImageLimitSettings bound what an image from outside may cost a
// node (issue 24). A copy refused by one of them failed for good; a change
// of that setting's value gives it one more try (see limitSettingMoved),
// or raising a cap would only help images created afterwards.
var backingImageLimitSettings = []types.SettingName{
	types.SettingBackingImageMaxVirtualSize,
	types.SettingBackingImageDownloadMaxSize,
	types.SettingBackingImageDownloadAllowedNetworks,
}

func isBackingImageLimitSetting(name string) bool {
	return slices.Contains(backingImageLimitSettings, types.SettingName(name))
}

// imageLimits are the caps on preparing an image (a download or an upload).
func imageLimits(ds *datastore.DataStore) (imagefile.Limits, error) {
	gib, err := ds.GetSettingInt(types.SettingBackingImageMaxVirtualSize)
	if err != nil {
		return imagefile.Limits{}, err
	}
	return imagefile.Limits{MaxVirtualSize: gib << 30}, nil
}

// downloadPolicy is what a download from the image's URL may do; the
// timeouts are imagefile's defaults.
func downloadPolicy(ds *datastore.DataStore) (imagefile.DownloadPolicy, error) {
	gib, err := ds.GetSettingInt(types.SettingBackingImageDownloadMaxSize)
	if err != nil {
		return imagefile.DownloadPolicy{}, err
	}
	allowed, err := ds.GetSettingNetworks(types.SettingBackingImageDownloadAllowedNetworks)
	if err != nil {
		return imagefile.DownloadPolicy{}, err
	}
	refused, err := clusterRanges(ds, net.InterfaceAddrs)
	if err != nil {
		return imagefile.DownloadPolicy{}, err
	}
	return imagefile.DownloadPolicy{MaxSize: gib << 30, Refused: refused, Allowed: allowed.Prefixes, AllowedHosts: allowed.Hosts,
		AllowedBy: "the setting " + string(types.SettingBackingImageDownloadAllowedNetworks)}, nil
}

// clusterRanges are the cluster's own addresses, which a download may not
// reach on top of imagefile's defaults, wherever they are (a node's public
// address, a cluster on public ranges): this node's interface addresses
// (interfaceAddrs), every Node's addresses and Pod ranges (spec.podCIDRs)
// and the Service ranges (ServiceCIDR objects), read from the cache. A CNI
// that leaves spec.podCIDRs empty, or an API server without ServiceCIDRs,
// leaves those ranges to the defaults: they are private ranges in the
// usual case (10.244.0.0/16, 10.96.0.0/12), refused all the same.
// Loopback and link-local addresses are left to the defaults, whose
// refusal says what they are (the node's own services, the metadata
// endpoint) better than "an address of the node".
func clusterRanges(ds *datastore.DataStore, interfaceAddrs func() ([]net.Addr, error)) ([]imagefile.RefusedRange, error) {
	var out []imagefile.RefusedRange
	add := func(p netip.Prefix, class string) {
		out = append(out, imagefile.RefusedRange{Prefix: p, Class: class})
	}
	addAddress := func(ip netip.Addr, class string) {
		if ip = ip.WithZone("").Unmap(); !ip.IsLoopback() && !ip.IsLinkLocalUnicast() && !ip.IsUnspecified() {
			add(netip.PrefixFrom(ip, ip.BitLen()), class)
		}
	}
	addrs, err := interfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("listing this node's addresses, which downloads may not reach: %w", err)
	}
	for _, a := range addrs {
		if ipNet, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipNet.IP); ok {
				addAddress(ip, "an address of this node")
			}
		}
	}
	nodes, err := ds.KubeNodes.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		for _, a := range n.Status.Addresses {
			ip, err := netip.ParseAddr(a.Address)
			if err != nil || (a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP) {
				continue
			}
			addAddress(ip, "an address of the node "+n.Name)
		}
		for _, cidr := range n.Spec.PodCIDRs {
			if p, err := netip.ParsePrefix(cidr); err == nil {
				add(p.Masked(), "a Pod network address of the cluster")
			}
		}
	}
	serviceCIDRs, err := ds.ServiceCIDRs.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	for _, sc := range serviceCIDRs {
		for _, cidr := range sc.Spec.CIDRs {
			if p, err := netip.ParsePrefix(cidr); err == nil {
				add(p.Masked(), "a Service address of the cluster")
			}
		}
	}
	return out, nil
}

// limitSetting names the setting a refusal depends on ("" for none).
func limitSetting(err error) types.SettingName {
	var le *imagefile.LimitError
	switch {
	case errors.As(err, &le) && le.Limit == imagefile.LimitDownloadSize:
		return types.SettingBackingImageDownloadMaxSize
	case errors.As(err, &le):
		return types.SettingBackingImageMaxVirtualSize
	case errors.Is(err, imagefile.ErrAddressRefused):
		return types.SettingBackingImageDownloadAllowedNetworks
	}
	return ""
}

// notRetriedHint ends the message of a copy that failed for good: what
// would make it go, the setting that refused it included.
func notRetriedHint(kind string, err error) string {
	name := limitSetting(err)
	switch {
	case kind == jobUploading && name != "":
		return fmt.Sprintf("%s, or raise the setting %s", notRetriedUpload, name)
	case kind == jobUploading:
		return notRetriedUpload
	case name != "":
		return fmt.Sprintf("not retried until the image's spec or the setting %s changes", name)
	}
	return notRetried
}

// noteLimitSettingChanged records that a limit setting's value changed:
// a transfer it refused that had started before cannot be held for good
// (it may have run with the old value).
func (j *fileJobs) noteLimitSettingChanged(name types.SettingName) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.limitChangedAt[name] = time.Now()
}

// limitChangedSince tells whether the setting changed after start (both
// on this process's monotonic clock, so no rounding can hide a change).
func (j *fileJobs) limitChangedSince(name types.SettingName, start time.Time) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.limitChangedAt[name].After(start)
}

// limitSettingMoved tells whether the setting that refused a copy for good
// has another value now than when it refused it: then the copy is tried
// again. It reads the cache (no API call).
func limitSettingMoved(ds *datastore.DataStore, st *v1beta1.BackingImageDiskFileStatus) bool {
	if st.FailedSetting == "" {
		return false
	}
	if _, known := types.SettingDefinitions[types.SettingName(st.FailedSetting)]; !known {
		// A setting since removed (backing-image-download-allow-local-addresses,
		// replaced by backing-image-download-allowed-networks): tried again
		// under today's settings, or no change of them would free the copy.
		return true
	}
	value, err := ds.GetSettingValue(types.SettingName(st.FailedSetting))
	return err == nil && value != st.FailedSettingValue
}
