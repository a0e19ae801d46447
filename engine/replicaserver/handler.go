// Package replicaserver serves a replica over the data connection: block I/O
// goes straight to the replica, and the engine's control calls
// (engine/replicactl) are dispatched to the replica's operations.
package replicaserver

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/engine/dataconn"
	"github.com/strata-storage/strata/engine/internal/errclass"
	"github.com/strata-storage/strata/engine/replica"
	"github.com/strata-storage/strata/engine/replicactl"
)

// maxLayerRead bounds one read-layer reply (JSON, or raw bytes on request).
const maxLayerRead = 4 << 20

// Handler is a dataconn.Handler over one replica.
type Handler struct {
	*replica.Replica
	log logrus.FieldLogger

	// Purge runs in the background: a control call is a barrier on the
	// connection, and a long purge must not stall the volume's I/O.
	purgeMu     sync.Mutex
	purge       replicactl.PurgeStatusReply
	purgeDone   chan struct{}
	purgeCtx    context.Context
	purgeCancel context.CancelFunc
}

// New serves r. Close stops a running purge.
func New(r *replica.Replica, log logrus.FieldLogger) *Handler {
	ctx, cancel := context.WithCancel(context.Background())
	return &Handler{Replica: r, log: log, purgeCtx: ctx, purgeCancel: cancel}
}

// Close stops a running purge and waits for it; it does not close the replica.
func (h *Handler) Close() {
	h.purgeCancel()
	h.purgeMu.Lock()
	done := h.purgeDone
	h.purgeMu.Unlock()
	if done != nil {
		<-done
	}
}

// Control dispatches one control call.
func (h *Handler) Control(_ context.Context, method string, raw json.RawMessage) (json.RawMessage, error) {
	switch method {
	case replicactl.SnapshotCheck, replicactl.Snapshot:
		var a replicactl.SnapshotArgs
		if err := decode(raw, &a); err != nil {
			return nil, err
		}
		opts := replica.SnapshotOptions{UserCreated: a.UserCreated, Created: a.Created, Labels: a.Labels, ID: a.ID}
		if method == replicactl.SnapshotCheck {
			return nil, classify(h.CheckSnapshot(a.Name, opts))
		}
		return nil, classify(h.Snapshot(a.Name, opts))
	case replicactl.Remove:
		var a replicactl.NameArgs
		if err := decode(raw, &a); err != nil {
			return nil, err
		}
		return nil, classify(h.RemoveSnapshot(a.Name))
	case replicactl.Revert:
		var a replicactl.NameArgs
		if err := decode(raw, &a); err != nil {
			return nil, err
		}
		return nil, classify(h.Revert(a.Name))
	case replicactl.Expand:
		var a replicactl.SizeArgs
		if err := decode(raw, &a); err != nil {
			return nil, err
		}
		return nil, classify(h.Expand(a.Size))
	case replicactl.SetLimits:
		var a replicactl.LimitsArgs
		if err := decode(raw, &a); err != nil {
			return nil, err
		}
		h.SetLimits(a.MaxCount, a.MaxSize)
		return nil, nil
	case replicactl.Chain:
		return h.chain()
	case replicactl.Extents:
		var a replicactl.NameArgs
		if err := decode(raw, &a); err != nil {
			return nil, err
		}
		exts, err := h.Extents(a.Name)
		if err != nil {
			return nil, classify(err)
		}
		out := make([]replicactl.Extent, len(exts))
		for i, e := range exts {
			out[i] = replicactl.Extent{Offset: e.Offset, Length: e.Length}
		}
		return json.Marshal(out)
	case replicactl.ReadLayer:
		var a replicactl.ReadLayerArgs
		if err := decode(raw, &a); err != nil {
			return nil, err
		}
		if a.Length < 0 || a.Length > maxLayerRead {
			return nil, fmt.Errorf("read-layer length %d outside [0, %d]: %w", a.Length, maxLayerRead, dataconn.ErrInvalidArgument)
		}
		buf := make([]byte, a.Length)
		if _, err := h.ReadLayer(a.Layer, buf, a.Offset); err != nil {
			return nil, classify(err)
		}
		if a.Raw {
			return buf, nil // not JSON: the caller asked for dataconn.Raw
		}
		return json.Marshal(buf)
	case replicactl.ImportBegin:
		var a replicactl.ImportBeginArgs
		if len(raw) > 0 && string(raw) != "null" {
			if err := decode(raw, &a); err != nil {
				return nil, err
			}
		}
		return nil, classify(h.BeginImport(replica.ImportOptions{Reuse: a.Reuse}))
	case replicactl.ImportWrite:
		return nil, h.importWrite(raw)
	case replicactl.ImportCommit:
		return nil, h.importCommit(raw)
	case replicactl.ImportAbort:
		return nil, classify(h.AbortImport())
	case replicactl.PurgeStart:
		h.startPurge()
		return nil, nil
	case replicactl.PurgeStatus:
		h.purgeMu.Lock()
		st := h.purge
		h.purgeMu.Unlock()
		return json.Marshal(st)
	}
	return nil, fmt.Errorf("%q: %w", method, dataconn.ErrUnknownMethod)
}

func (h *Handler) importWrite(raw json.RawMessage) error {
	if len(raw) == 0 {
		return fmt.Errorf("missing arguments: %w", dataconn.ErrInvalidArgument)
	}
	a, data, err := replicactl.SplitImportWrite(raw)
	if err != nil {
		return fmt.Errorf("arguments: %v: %w", err, dataconn.ErrInvalidArgument)
	}
	if len(data) == 0 && a.Zeroes > 0 {
		if a.Zeroes > replicactl.MaxImportWrite {
			return fmt.Errorf("import-write of %d zero bytes exceeds %d: %w", a.Zeroes, replicactl.MaxImportWrite, dataconn.ErrInvalidArgument)
		}
		data = make([]byte, a.Zeroes)
	}
	if len(data) > replicactl.MaxImportWrite {
		return fmt.Errorf("import-write of %d bytes exceeds %d: %w", len(data), replicactl.MaxImportWrite, dataconn.ErrInvalidArgument)
	}
	return classify(h.ImportWrite(a.Layer, data, a.Offset))
}

func (h *Handler) importCommit(raw json.RawMessage) error {
	var a replicactl.ImportCommitArgs
	if err := decode(raw, &a); err != nil {
		return err
	}
	keep := make(map[string]bool, len(a.Keep))
	for _, name := range a.Keep {
		keep[name] = true
	}
	layers := make([]replica.ImportLayer, len(a.Layers))
	for i, l := range a.Layers {
		var created time.Time
		if l.Created != "" {
			var err error
			if created, err = time.Parse(time.RFC3339Nano, l.Created); err != nil {
				return fmt.Errorf("layer %s: created %q: %v: %w", l.Name, l.Created, err, dataconn.ErrInvalidArgument)
			}
		}
		layers[i] = replica.ImportLayer{Name: l.Name, Parent: l.Parent, Removed: l.Removed,
			UserCreated: l.UserCreated, Created: created, Labels: l.Labels, ID: l.ID, Keep: keep[l.Name]}
		delete(keep, l.Name)
	}
	if len(keep) > 0 {
		return fmt.Errorf("keep names %q, not in the imported chain: %w", slices.Sorted(maps.Keys(keep)), dataconn.ErrInvalidArgument)
	}
	err := h.CommitImport(layers, a.HeadParent)
	// Here a bad-meta error means the chain given was not a tree of snapshots.
	return classify(errclass.Map(err, errclass.Rule{From: replica.ErrBadMeta, To: dataconn.ErrInvalidArgument}))
}

func (h *Handler) chain() (json.RawMessage, error) {
	info, err := h.Chain()
	if err != nil {
		return nil, classify(err)
	}
	reply := replicactl.ChainReply{VolumeSize: info.Size, Layers: make(map[string]replicactl.Layer, len(info.Layers))}
	if info.BackingFile != "" {
		reply.Backing = &replicactl.Backing{File: info.BackingFile, Size: info.BackingSize}
	}
	for _, l := range info.Layers {
		created := ""
		if !l.Created.IsZero() {
			created = l.Created.UTC().Format("2006-01-02T15:04:05Z07:00")
		}
		reply.Layers[l.Name] = replicactl.Layer{Name: l.Name, Parent: l.Parent, Children: l.Children,
			Removed: l.Removed, UserCreated: l.UserCreated, Created: created, Size: l.Size, Labels: l.Labels, ID: l.ID,
			Exclusive: l.Exclusive}
	}
	return json.Marshal(reply)
}

// startPurge starts a purge unless one runs; asking again while it runs is
// not an error, since every replica of a volume is asked at once.
func (h *Handler) startPurge() {
	h.purgeMu.Lock()
	defer h.purgeMu.Unlock()
	if h.purge.IsPurging {
		return
	}
	h.purge = replicactl.PurgeStatusReply{IsPurging: true, State: "in-progress"}
	done := make(chan struct{})
	h.purgeDone = done
	go func() {
		defer close(done)
		err := h.Purge(h.purgeCtx, func(pct int) {
			h.purgeMu.Lock()
			h.purge.Progress = pct
			h.purgeMu.Unlock()
		})
		h.purgeMu.Lock()
		defer h.purgeMu.Unlock()
		h.purge.IsPurging = false
		if err != nil {
			h.purge.State, h.purge.Error = "error", err.Error()
			h.log.WithError(err).Warn("Purge failed")
			return
		}
		h.purge.State, h.purge.Progress, h.purge.Error = "complete", 100, ""
	}()
}

func decode(raw json.RawMessage, v any) error {
	if len(raw) == 0 {
		return fmt.Errorf("missing arguments: %w", dataconn.ErrInvalidArgument)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("arguments: %v: %w", err, dataconn.ErrInvalidArgument)
	}
	return nil
}

// classify gives replica errors the code they travel with, so the engine
// and the instance manager can tell a refusal from a failure. The message
// stays the replica's own.
func classify(err error) error {
	return errclass.Map(err,
		errclass.Rule{From: replica.ErrSnapshotNotFound, To: dataconn.ErrNotFound},
		errclass.Rule{From: replica.ErrSnapshotExists, To: dataconn.ErrAlreadyExists},
		errclass.Rule{From: replica.ErrSnapshotLimitExceeded, To: dataconn.ErrLimitExceeded},
		errclass.Rule{From: replica.ErrInvalidName, To: dataconn.ErrInvalidArgument},
		errclass.Rule{From: replica.ErrSnapshotRemoved, To: dataconn.ErrInvalidArgument},
		errclass.Rule{From: replica.ErrNotEmpty, To: dataconn.ErrInvalidArgument},
		errclass.Rule{From: replica.ErrBadImport, To: dataconn.ErrInvalidArgument},
	)
}
