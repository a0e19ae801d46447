package controller

import (
	"net"
	"strconv"

	"github.com/strata-storage/strata/engineapi/impb"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// instanceState maps the data plane's instance state onto the API's.
func instanceState(s impb.InstanceState) v1beta1.InstanceState {
	switch s {
	case impb.InstanceState_INSTANCE_STATE_STARTING:
		return v1beta1.InstanceStateStarting
	case impb.InstanceState_INSTANCE_STATE_RUNNING:
		return v1beta1.InstanceStateRunning
	case impb.InstanceState_INSTANCE_STATE_STOPPING:
		return v1beta1.InstanceStateStopping
	case impb.InstanceState_INSTANCE_STATE_STOPPED:
		return v1beta1.InstanceStateStopped
	case impb.InstanceState_INSTANCE_STATE_ERROR:
		return v1beta1.InstanceStateError
	}
	return v1beta1.InstanceStateUnknown
}

func replicaMode(m impb.ReplicaMode) v1beta1.ReplicaMode {
	switch m {
	case impb.ReplicaMode_REPLICA_MODE_RW:
		return v1beta1.ReplicaModeRW
	case impb.ReplicaMode_REPLICA_MODE_WO:
		return v1beta1.ReplicaModeWO
	}
	return v1beta1.ReplicaModeERR
}

// observeInstance fills the status both engines and replicas share from what
// the instance cache holds. found=false means the instance manager runs no
// such instance; synced=false means this manager has no live view of it.
func observeInstance(st *v1beta1.InstanceStatus, inst *impb.Instance, found, synced bool, imName string) {
	st.InstanceManagerName = imName
	switch {
	case !synced:
		st.CurrentState = v1beta1.InstanceStateUnknown
	case !found:
		st.CurrentState = v1beta1.InstanceStateStopped
		st.IP, st.Port = "", 0
	default:
		st.CurrentState = instanceState(inst.GetState())
		st.IP, st.Port = splitAddress(inst.GetAddress())
		if st.CurrentState == v1beta1.InstanceStateRunning {
			st.Started = true
		}
	}
}

// observeUnreachable is the status of an instance whose node this manager
// cannot see: its node is down, or it is not scheduled yet.
func observeUnreachable(st *v1beta1.InstanceStatus, nodeID string) {
	st.InstanceManagerName = ""
	st.IP, st.Port = "", 0
	if nodeID == "" {
		st.CurrentState = v1beta1.InstanceStateStopped
		return
	}
	st.CurrentState = v1beta1.InstanceStateUnknown
}

func splitAddress(addr string) (string, int32) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", 0
	}
	return host, int32(p)
}

// instanceAddress is the dataconn address a running replica serves on.
func instanceAddress(st *v1beta1.InstanceStatus) string {
	if st.IP == "" || st.Port == 0 {
		return ""
	}
	return net.JoinHostPort(st.IP, strconv.Itoa(int(st.Port)))
}

func snapshotInfos(in map[string]*impb.Snapshot) map[string]*v1beta1.SnapshotInfo {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]*v1beta1.SnapshotInfo, len(in))
	for name, s := range in {
		var children map[string]bool
		if len(s.GetChildren()) > 0 {
			children = make(map[string]bool, len(s.GetChildren()))
			for _, c := range s.GetChildren() {
				children[c] = true
			}
		}
		var labels map[string]string
		if len(s.GetLabels()) > 0 {
			labels = s.GetLabels()
		}
		out[name] = &v1beta1.SnapshotInfo{Name: name, Parent: s.GetParent(), Children: children, Removed: s.GetRemoved(),
			UserCreated: s.GetUserCreated(), Created: s.GetCreated(), Size: s.GetSize(), Labels: labels}
	}
	return out
}
