package csi

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// NodeGetInfo names the Strata node: the kubelet records it in CSINode and
// the external-attacher passes it back as ControllerPublish's node id.
func (d *Driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{
		NodeId:             d.opts.NodeID,
		AccessibleTopology: &csi.Topology{Segments: map[string]string{TopologyNodeKey: d.opts.NodeID}},
	}, nil
}

func (d *Driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{}, nil
}
