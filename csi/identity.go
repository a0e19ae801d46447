package csi

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func (d *Driver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: DriverName, VendorVersion: d.opts.Version}, nil
}

func (d *Driver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	var caps []*csi.PluginCapability
	if d.opts.Mode.controller() {
		caps = append(caps,
			pluginCap(csi.PluginCapability_Service_CONTROLLER_SERVICE),
			pluginCap(csi.PluginCapability_Service_GROUP_CONTROLLER_SERVICE),
			pluginCap(csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS),
			&csi.PluginCapability{Type: &csi.PluginCapability_VolumeExpansion_{VolumeExpansion: &csi.PluginCapability_VolumeExpansion{
				Type: csi.PluginCapability_VolumeExpansion_ONLINE}}})
		if d.opts.Blocks != nil {
			caps = append(caps, pluginCap(csi.PluginCapability_Service_SNAPSHOT_METADATA_SERVICE))
		}
	}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

func pluginCap(t csi.PluginCapability_Service_Type) *csi.PluginCapability {
	return &csi.PluginCapability{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: t}}}
}

// Probe answers ready once the driver's view of the cluster is current, so
// the sidecars do not send calls it would answer from an empty cache.
func (d *Driver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(d.ready.Load())}, nil
}
