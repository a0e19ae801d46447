package instance

import (
	"net"
	"strconv"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// instanceState maps the data plane's instance state onto the API's; the
// data plane spells its states as the API does.
func instanceState(s engineapi.InstanceState) v1beta1.InstanceState {
	if s == "" {
		return v1beta1.InstanceStateUnknown
	}
	return v1beta1.InstanceState(s)
}

// observeInstance fills the status both engines and replicas share from what
// the instance cache holds. found=false means the instance manager runs no
// such instance; synced=false means this manager has no live view of it.
func observeInstance(st *v1beta1.InstanceStatus, inst *engineapi.Instance, found, synced bool, imName string) {
	st.InstanceManagerName = imName
	switch {
	case !synced:
		st.CurrentState = v1beta1.InstanceStateUnknown
	case !found:
		st.CurrentState = v1beta1.InstanceStateStopped
		st.IP, st.Port = "", 0
	default:
		st.CurrentState = instanceState(inst.State)
		st.IP, st.Port = splitAddress(inst.Address)
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

func snapshotInfos(in map[string]*engineapi.Snapshot) map[string]*v1beta1.SnapshotInfo {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]*v1beta1.SnapshotInfo, len(in))
	for name, s := range in {
		var children map[string]bool
		if len(s.Children) > 0 {
			children = make(map[string]bool, len(s.Children))
			for _, c := range s.Children {
				children[c] = true
			}
		}
		var labels map[string]string
		if len(s.Labels) > 0 {
			labels = s.Labels
		}
		out[name] = &v1beta1.SnapshotInfo{Name: name, Parent: s.Parent, Children: children, Removed: s.Removed,
			UserCreated: s.UserCreated, Created: s.Created, Size: s.Size, Labels: labels, Exclusive: s.Exclusive}
	}
	return out
}
