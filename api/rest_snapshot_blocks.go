package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// snapshotBlocks answers where a snapshot holds data, or what changed
// since an older snapshot of the volume: changed-block tracking for backup
// tools (the CSI SnapshotMetadata service asks the same of the engine). It
// is read from the volume's running engine, wherever it runs; a detached
// volume is attached without a frontend to this manager's node for the
// time of the call, as for a revert.

const (
	// defaultBlocksPage and maxBlocksPage bound the extents of one answer;
	// a caller pages on with next.
	defaultBlocksPage = 10000
	maxBlocksPage     = 100000
	// blockSize is the granularity of the answers.
	blockSize = 4096
)

type blocksRequest struct {
	Snapshot       string `json:"snapshot"`
	Base           string `json:"base"`
	StartingOffset int64  `json:"startingOffset"`
	MaxResults     int    `json:"maxResults"`
}

// BlocksReply is an answer of snapshotBlocks. Next, when set, is the
// startingOffset of the following page.
type BlocksReply struct {
	Snapshot   string                  `json:"snapshot"`
	Base       string                  `json:"base,omitempty"`
	VolumeSize int64                   `json:"volumeSize"`
	BlockSize  int64                   `json:"blockSize"`
	Extents    []engineapi.BlockExtent `json:"extents"`
	Next       *int64                  `json:"next,omitempty"`
}

// errEnoughBlocks ends a SnapshotBlocks stream once a page is full.
var errEnoughBlocks = errors.New("page full")

func (c *call) snapshotBlocks() error {
	volume := c.r.PathValue("name")
	var req blocksRequest
	if err := c.decode(&req); err != nil {
		return err
	}
	if err := req.check(); err != nil {
		return err
	}
	if err := c.authorize("get", "snapshots", c.opts.Namespace, req.Snapshot); err != nil {
		return err
	}
	for _, f := range [][2]string{{"snapshot", req.Snapshot}, {"base", req.Base}} {
		if f[1] == "" {
			continue
		}
		if s, err := c.opts.Cache.Snapshots.GetRO(f[1]); err != nil || s.Spec.Volume != volume || !s.Status.ReadyToUse {
			return fmt.Errorf("%s: snapshot %q of volume %q, taken: %w", f[0], f[1], volume, errNotFound)
		}
	}
	if c.opts.DataPlane == nil || c.opts.NodeName == "" {
		return fmt.Errorf("%w: this manager has no data plane to ask", ErrAuthUnavailable)
	}
	// A volume attaching or detaching, or an engine this manager's cache
	// still lists after it stopped, settles within moments: ask again
	// until it has, for as long as an attach for the call may take.
	var reply *BlocksReply
	var last error
	err := wait.PollUntilContextTimeout(c.ctx(), 250*time.Millisecond, revertAttachTimeout, true, func(context.Context) (bool, error) {
		reply, last = c.blocksOnce(volume, req)
		if errors.Is(last, errInUse) {
			return false, nil
		}
		return last == nil, last
	})
	if wait.Interrupted(err) && last != nil {
		err = last
	}
	if err != nil {
		return err
	}
	return c.reply(http.StatusOK, reply)
}

// blocksOnce reads a page from the volume's running engine, attaching a
// detached volume for the call.
func (c *call) blocksOnce(volume string, req blocksRequest) (*BlocksReply, error) {
	engine, release, err := c.runningEngineFor(volume)
	if err != nil {
		return nil, err
	}
	defer release()
	return c.readBlocks(engine, req)
}

func (req *blocksRequest) check() error {
	switch {
	case req.Snapshot == "":
		return badInput("snapshot", "missing: name the snapshot")
	case req.Base == req.Snapshot:
		return badInput("base", "%q is the snapshot itself: name an older snapshot, or none for all its blocks", req.Base)
	case req.StartingOffset < 0:
		return badInput("startingOffset", "%d is negative", req.StartingOffset)
	case req.MaxResults < 0 || req.MaxResults > maxBlocksPage:
		return badInput("maxResults", "%d is not between 0 (the default, %d) and %d", req.MaxResults, defaultBlocksPage, maxBlocksPage)
	}
	if req.MaxResults == 0 {
		req.MaxResults = defaultBlocksPage
	}
	return nil
}

// readBlocks reads one page of extents: a page and one more, to tell
// whether another page follows.
func (c *call) readBlocks(engine *v1beta1.Engine, req blocksRequest) (*BlocksReply, error) {
	dp, err := c.engineDataPlane(engine)
	if err != nil {
		return nil, err
	}
	reply := &BlocksReply{Snapshot: req.Snapshot, Base: req.Base, BlockSize: blockSize, Extents: []engineapi.BlockExtent{}}
	args := engineapi.SnapshotBlocksArgs{Engine: engine.Name, Snapshot: req.Snapshot, Base: req.Base,
		StartingOffset: req.StartingOffset}
	err = dp.SnapshotBlocks(c.ctx(), args, func(size int64, exts []engineapi.BlockExtent) error {
		reply.VolumeSize = size
		reply.Extents = append(reply.Extents, exts...)
		if len(reply.Extents) > req.MaxResults {
			return errEnoughBlocks
		}
		return nil
	})
	switch {
	case errors.Is(err, errEnoughBlocks):
		last := reply.Extents[req.MaxResults-1]
		next := last.Offset + last.Length
		reply.Extents, reply.Next = reply.Extents[:req.MaxResults], &next
	case errors.Is(err, engineapi.ErrNotFound):
		return nil, fmt.Errorf("snapshot %q in the engine of volume %q: %w", req.Snapshot, engine.Spec.VolumeName, errNotFound)
	case errors.Is(err, engineapi.ErrInvalid):
		return nil, badInput("base", "%v", err)
	case errors.Is(err, engineapi.ErrBusy):
		return nil, fmt.Errorf("volume %q: %w: %v", engine.Spec.VolumeName, errInUse, err)
	case err != nil:
		return nil, fmt.Errorf("reading the blocks of snapshot %q: %w", req.Snapshot, err)
	}
	return reply, nil
}

// runningEngineFor returns the volume's running engine. A detached volume
// no ticket holds is attached here without a frontend for the call, and
// release gives it back; a volume on its way up or down is 409.
func (c *call) runningEngineFor(volume string) (*v1beta1.Engine, func(), error) {
	v, err := volumes.cached(c, volume)
	if err != nil {
		return nil, nil, err
	}
	if v.Status.State == v1beta1.VolumeStateAttached {
		engines, err := c.opts.Cache.Engines.ListByIndexRO(datastore.IndexByVolume, volume)
		if err != nil {
			return nil, nil, err
		}
		for _, e := range engines {
			if e.Spec.NodeID == v.Status.CurrentNodeID && e.Status.CurrentState == v1beta1.InstanceStateRunning {
				return e, func() {}, nil
			}
		}
	}
	if v.Status.State != v1beta1.VolumeStateDetached {
		return nil, nil, fmt.Errorf("volume %q is %w: it is %s; ask again once it is attached or detached", volume, errInUse, v.Status.State)
	}
	ticket := newTicketID()
	attach := attachRequest{Node: c.opts.NodeName, DisableFrontend: true, TicketID: ticket}
	// Labelled as a revert's: a manager killed meanwhile releases it when
	// it starts again (ReleaseRevertTickets).
	if _, _, _, err := c.holdTicket(volume, attach, revertTicketTTL, true); err != nil {
		return nil, nil, err
	}
	release := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c.dropTicket(ctx, volume, ticket)
	}
	engine, err := c.waitEngineUp(volume)
	if err != nil {
		release()
		return nil, nil, err
	}
	return engine, release, nil
}
