package snapshot

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

const (
	EventReasonGroupSnapshotTaken  = "GroupSnapshotTaken"
	EventReasonGroupSnapshotFailed = "GroupSnapshotFailed"
	EventReasonGroupCutRolledBack  = "GroupCutRolledBack"
)

// groupCutTimeout bounds a cut's freeze: writes of the group's volumes
// stall at most this long, also when this manager dies mid-cut.
const groupCutTimeout = 10 * time.Second

// groupTicketID is the attachment ticket a group holds on a detached
// member volume until its cut is done.
func groupTicketID(group string) string { return "snapshot-group-" + group }

// groupMember is one volume of a group, ready to be cut.
type groupMember struct {
	vol      *v1beta1.Volume
	eng      *v1beta1.Engine
	snapshot string
}

func (c *SnapshotGroupController) syncGroup(ctx context.Context, key string) error {
	gRO, ok, err := kit.GetResponsible(c.BaseController, c.DS.SnapshotGroups, key, c.groupOwner)
	if err != nil || !ok || gRO.DeletionTimestamp != nil {
		return err // members go with the group (owner references)
	}
	g := gRO.DeepCopy()
	g.Status.OwnerID = c.ControllerID
	if g.Status.State == "" {
		g.Status.State = v1beta1.SnapshotGroupPending
	}
	var actErr error
	switch g.Status.State {
	case v1beta1.SnapshotGroupReady:
		actErr = c.ensureMemberCRs(ctx, g)
	case v1beta1.SnapshotGroupFailed:
	case v1beta1.SnapshotGroupCutting:
		// A cut began and its manager never recorded the end: take back
		// whatever part of it was taken, then cut again. Only if the API
		// server agrees: the cache may not have the end of this manager's
		// own cut yet, and rolling back a finished cut removes good data.
		live, err := c.DS.SnapshotGroups.GetLive(ctx, g.Name)
		if err != nil || live.Status.State != v1beta1.SnapshotGroupCutting || live.ResourceVersion != gRO.ResourceVersion {
			return err // the newer version is on its way to the cache
		}
		actErr = c.rollBack(ctx, g)
	default:
		actErr = c.cutWhenReady(ctx, g)
	}
	if g.Status.State == v1beta1.SnapshotGroupReady || g.Status.State == v1beta1.SnapshotGroupFailed {
		actErr = errors.Join(actErr, c.releaseTickets(ctx, g))
	}
	return errors.Join(actErr, c.writeGroupStatus(ctx, gRO, g))
}

// groupOwner: the group is cut by the manager of its first volume.
func (c *SnapshotGroupController) groupOwner(g *v1beta1.SnapshotGroup) (string, string) {
	if len(g.Spec.Volumes) == 0 {
		return g.Status.OwnerID, ""
	}
	vol, err := c.DS.Volumes.GetRO(g.Spec.Volumes[0])
	if err != nil {
		return g.Status.OwnerID, ""
	}
	return g.Status.OwnerID, vol.Status.OwnerID
}

func (c *SnapshotGroupController) writeGroupStatus(ctx context.Context, before, g *v1beta1.SnapshotGroup) error {
	if equality.Semantic.DeepEqual(before.Status, g.Status) {
		return nil
	}
	_, err := c.DS.SnapshotGroups.UpdateStatus(ctx, g)
	return err
}

// cutWhenReady cuts once every member's engine runs; until then it asks
// for detached volumes to be attached and says what it waits for.
func (c *SnapshotGroupController) cutWhenReady(ctx context.Context, g *v1beta1.SnapshotGroup) error {
	members, waiting, err := c.groupMembers(ctx, g)
	if err != nil {
		if errors.Is(err, errGroupFailed) {
			c.failGroup(g, err.Error())
			return nil
		}
		return err
	}
	if waiting != "" {
		g.Status.Error = waiting
		return nil
	}
	// Recorded before the cut: a manager that dies during it leaves
	// Cutting, and the next one rolls the cut back (rollBack).
	g.Status.State, g.Status.Error = v1beta1.SnapshotGroupCutting, ""
	g.Status.Attempt++
	for _, m := range members {
		m.snapshot = memberSnapshotName(g.Name, m.vol.Name, g.Status.Attempt)
	}
	g.Status.Snapshots = memberList(members)
	if err := c.persistStatus(ctx, g); err != nil {
		return err
	}
	res, cutErr := c.cut(ctx, g, members)
	if cutErr != nil {
		return c.cutFailed(ctx, g, cutErr)
	}
	g.Status.State, g.Status.ReadyToUse = v1beta1.SnapshotGroupReady, true
	g.Status.CreationTime = time.Now().UTC().Format(time.RFC3339)
	g.Status.StallMilliseconds = res.Stall.Milliseconds()
	c.Recorder.Eventf(g, corev1.EventTypeNormal, EventReasonGroupSnapshotTaken,
		"took a crash-consistent snapshot of %d volumes; their writes waited %d ms", len(members), g.Status.StallMilliseconds)
	return c.ensureMemberCRs(ctx, g)
}

// persistStatus writes g's status now, keeping g's resource version current
// for the sync's final write.
func (c *SnapshotGroupController) persistStatus(ctx context.Context, g *v1beta1.SnapshotGroup) error {
	out, err := c.DS.SnapshotGroups.UpdateStatus(ctx, g)
	if err != nil {
		return err
	}
	g.ResourceVersion = out.ResourceVersion
	return nil
}

func (c *SnapshotGroupController) cut(ctx context.Context, g *v1beta1.SnapshotGroup, members []*groupMember) (engineapi.CutResult, error) {
	labels := maps.Clone(g.Spec.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[types.LabelSnapshotGroup] = g.Name
	cut := make([]engineapi.CutMember, 0, len(members))
	for _, m := range members {
		dp, err := c.EngineDataPlane(m.eng)
		if err != nil {
			return engineapi.CutResult{}, err
		}
		cut = append(cut, engineapi.CutMember{Client: dp, Engine: m.eng.Name, Snapshot: m.snapshot, UserCreated: true, Labels: labels,
			FSFreeze: fsFreezeFor(c.DS, m.vol)})
	}
	return engineapi.TakeGroupCut(ctx, g.Name+"-"+strconv.Itoa(int(g.Status.Attempt)), cut, groupCutTimeout)
}

// cutFailed records a failed cut: for good when an engine refused what a
// retry cannot change (a limit, an invalid name), else back to Pending to
// try again. TakeGroupCut removed what it had taken.
func (c *SnapshotGroupController) cutFailed(ctx context.Context, g *v1beta1.SnapshotGroup, err error) error {
	g.Status.Snapshots = nil
	if errors.Is(err, engineapi.ErrLimitExceeded) || errors.Is(err, engineapi.ErrInvalid) {
		c.failGroup(g, err.Error())
		return nil
	}
	g.Status.State, g.Status.Error = v1beta1.SnapshotGroupPending, "the cut failed, retrying: "+err.Error()
	c.Recorder.Event(g, corev1.EventTypeWarning, EventReasonGroupSnapshotFailed, g.Status.Error)
	return fmt.Errorf("group snapshot %s: %w", g.Name, err)
}

func (c *SnapshotGroupController) failGroup(g *v1beta1.SnapshotGroup, why string) {
	g.Status.State, g.Status.ReadyToUse, g.Status.Error, g.Status.Snapshots = v1beta1.SnapshotGroupFailed, false, why, nil
	c.Recorder.Event(g, corev1.EventTypeWarning, EventReasonGroupSnapshotFailed, why)
}

var errGroupFailed = errors.New("group snapshot cannot be taken")

// groupMembers resolves every volume to its running engine. waiting says
// what the cut waits for (a volume attaching: a ticket asks for it); an
// error wrapping errGroupFailed is for good.
func (c *SnapshotGroupController) groupMembers(ctx context.Context, g *v1beta1.SnapshotGroup) ([]*groupMember, string, error) {
	var members []*groupMember
	waiting := ""
	for _, name := range g.Spec.Volumes {
		vol, err := c.DS.Volumes.GetRO(name)
		if apierrors.IsNotFound(err) || (err == nil && vol.DeletionTimestamp != nil) {
			return nil, "", fmt.Errorf("%w: volume %s does not exist", errGroupFailed, name)
		}
		if err != nil {
			return nil, "", err
		}
		eng, err := c.VolumeEngine(vol)
		if err != nil {
			return nil, "", err
		}
		running := eng != nil && kit.EngineRunning(eng) && vol.Status.CurrentNodeID == eng.Spec.NodeID &&
			vol.Status.State == v1beta1.VolumeStateAttached
		if !running {
			if err := c.ensureGroupTicket(ctx, g, vol); err != nil {
				return nil, "", err
			}
			if waiting == "" {
				waiting = fmt.Sprintf("waiting for volume %s to attach (state %q)", name, vol.Status.State)
			}
			continue
		}
		members = append(members, &groupMember{vol: vol, eng: eng})
	}
	return members, waiting, nil
}

func (c *SnapshotGroupController) ensureGroupTicket(ctx context.Context, g *v1beta1.SnapshotGroup, vol *v1beta1.Volume) error {
	return c.EnsureSnapshotterTicket(ctx, vol, groupTicketID(g.Name), "SnapshotGroup", g)
}

func (c *SnapshotGroupController) releaseTickets(ctx context.Context, g *v1beta1.SnapshotGroup) error {
	var errs []error
	for _, vol := range g.Spec.Volumes {
		errs = append(errs, c.RemoveTicket(ctx, vol, groupTicketID(g.Name)))
	}
	return errors.Join(errs...)
}

// rollBack removes the snapshots a cut that never ended may have taken
// (removing one never taken is fine), then returns the group to Pending.
func (c *SnapshotGroupController) rollBack(ctx context.Context, g *v1beta1.SnapshotGroup) error {
	var errs []error
	for _, m := range g.Status.Snapshots {
		errs = append(errs, c.removeMemberSnapshot(ctx, g, m))
	}
	if errors.Join(errs...) == nil {
		// The engine monitor may have given what the cut took its CR,
		// labelled with the group: deleting it now (which purges the
		// removed snapshot) keeps the group's members the finished cut's,
		// rather than until a later purge takes it out of the chain.
		for _, m := range g.Status.Snapshots {
			if err := c.DS.Snapshots.Delete(ctx, m.Snapshot); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		g.Status.Error = "rolling back a cut that did not finish: " + err.Error()
		return fmt.Errorf("group snapshot %s: rolling back cut %d: %w", g.Name, g.Status.Attempt, err)
	}
	c.Recorder.Eventf(g, corev1.EventTypeWarning, EventReasonGroupCutRolledBack,
		"cut %d did not finish (its manager stopped): removed what it took; cutting again", g.Status.Attempt)
	g.Status.State, g.Status.Snapshots, g.Status.Error = v1beta1.SnapshotGroupPending, nil, ""
	return nil
}

// removeMemberSnapshot removes a member snapshot a cut may have taken; the
// engine tells whether it had (the cached chain may lag behind the cut).
func (c *SnapshotGroupController) removeMemberSnapshot(ctx context.Context, g *v1beta1.SnapshotGroup, m v1beta1.SnapshotGroupMember) error {
	vol, err := c.DS.Volumes.GetRO(m.Volume)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	eng, err := c.VolumeEngine(vol)
	if err != nil {
		return err
	}
	if eng == nil || !kit.EngineRunning(eng) {
		if err := c.ensureGroupTicket(ctx, g, vol); err != nil {
			return err
		}
		return fmt.Errorf("waiting for volume %s to attach to remove snapshot %s", m.Volume, m.Snapshot)
	}
	dp, err := c.EngineDataPlane(eng)
	if err != nil {
		return err
	}
	err = dp.SnapshotRemove(ctx, eng.Name, m.Snapshot)
	if errors.Is(err, engineapi.ErrNotFound) {
		return nil
	}
	return err
}

// ensureMemberCRs makes each member's Snapshot CR, which the engine monitor
// creates once the engine reports the snapshot (a CR made before would be
// taken for lost), the group's: labelled with it and owned by it alone, so
// deleting the group deletes its members.
func (c *SnapshotGroupController) ensureMemberCRs(ctx context.Context, g *v1beta1.SnapshotGroup) error {
	var errs []error
	for _, m := range g.Status.Snapshots {
		errs = append(errs, c.ensureMemberCR(ctx, g, m))
	}
	return errors.Join(errs...)
}

func (c *SnapshotGroupController) ensureMemberCR(ctx context.Context, g *v1beta1.SnapshotGroup, m v1beta1.SnapshotGroupMember) error {
	existing, err := c.DS.Snapshots.GetRO(m.Snapshot)
	if apierrors.IsNotFound(err) {
		return nil // not reported yet; the engine's change enqueues the group
	}
	if err != nil {
		return err
	}
	owners := []metav1.OwnerReference{groupOwnerRef(g)}
	if existing.Labels[types.LabelSnapshotGroup] == g.Name && equality.Semantic.DeepEqual(existing.OwnerReferences, owners) {
		return nil
	}
	s := existing.DeepCopy()
	if s.Labels == nil {
		s.Labels = map[string]string{}
	}
	s.Labels[types.LabelSnapshotGroup] = g.Name
	s.OwnerReferences = owners
	_, err = c.DS.Snapshots.Update(ctx, s)
	return err
}

func groupOwnerRef(g *v1beta1.SnapshotGroup) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: v1beta1.SchemeGroupVersion.String(), Kind: "SnapshotGroup", Name: g.Name, UID: g.UID}
}

func memberList(members []*groupMember) []v1beta1.SnapshotGroupMember {
	out := make([]v1beta1.SnapshotGroupMember, 0, len(members))
	for _, m := range members {
		out = append(out, v1beta1.SnapshotGroupMember{Volume: m.vol.Name, Snapshot: m.snapshot})
	}
	return out
}

// memberSnapshotName is <group>-<volume> (a retry adds -<attempt>: the
// failed cut's removed snapshots keep their names until purged), or a name
// made from their hash when that is no valid snapshot name.
func memberSnapshotName(group, volume string, attempt int32) string {
	name := group + "-" + volume
	if attempt > 1 {
		name += "-" + strconv.Itoa(int(attempt))
	}
	if types.ValidateSnapshotName(name) == nil {
		return name
	}
	return kit.DerivedSnapshotName("sg", name)
}

// joinGroup makes a Snapshot CR the engine monitor is about to create for a
// group's member (its engine labels name the group) the group's: labelled
// with it and owned by it alone. Without the group in the cache it stays
// the volume's; the group controller fixes it up (ensureMemberCR).
func (c *SnapshotController) joinGroup(s *v1beta1.Snapshot) {
	name := s.Spec.Labels[types.LabelSnapshotGroup]
	if name == "" {
		return
	}
	g, err := c.DS.SnapshotGroups.GetRO(name)
	if err != nil {
		return
	}
	s.Labels[types.LabelSnapshotGroup] = name
	s.OwnerReferences = []metav1.OwnerReference{groupOwnerRef(g)}
}
