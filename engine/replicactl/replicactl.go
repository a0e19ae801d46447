// Package replicactl names the control calls an engine makes on a replica
// over its data connection, with their arguments and replies. The replica
// side (engine/replicaserver) and the engine side (engine/replication) share
// these so neither spells a method name twice.
package replicactl

import "time"

// Control methods.
const (
	// SnapshotCheck validates a snapshot (name, limits) without taking it,
	// so an engine can refuse a snapshot before any replica has it.
	SnapshotCheck = "snapshot-check"
	Snapshot      = "snapshot"
	Remove        = "remove"
	// PurgeStart starts a purge in the background; PurgeStatus reports it.
	PurgeStart  = "purge-start"
	PurgeStatus = "purge-status"
	Revert      = "revert"
	Chain       = "chain"
	Expand      = "expand"
	SetLimits   = "set-limits"
	Extents     = "extents"
	ReadLayer   = "read-layer"
)

// SnapshotArgs are the arguments of SnapshotCheck and Snapshot.
type SnapshotArgs struct {
	Name        string            `json:"name"`
	UserCreated bool              `json:"userCreated"`
	Created     time.Time         `json:"created"`
	Labels      map[string]string `json:"labels,omitempty"`
}

// NameArgs name one snapshot (Remove, Revert) or layer (Extents).
type NameArgs struct {
	Name string `json:"name"`
}

// SizeArgs carry a new volume size (Expand).
type SizeArgs struct {
	Size int64 `json:"size"`
}

// LimitsArgs are snapshot limits; 0 means none.
type LimitsArgs struct {
	MaxCount int   `json:"maxCount"`
	MaxSize  int64 `json:"maxSize"`
}

// ReadLayerArgs read raw data of one layer.
type ReadLayerArgs struct {
	Layer  string `json:"layer"`
	Offset int64  `json:"offset"`
	Length int64  `json:"length"`
}

// Layer is one layer of a replica's chain.
type Layer struct {
	Name        string            `json:"name"`
	Parent      string            `json:"parent"`
	Children    []string          `json:"children,omitempty"`
	Removed     bool              `json:"removed"`
	UserCreated bool              `json:"userCreated"`
	Created     string            `json:"created"`
	Size        int64             `json:"size"`
	Labels      map[string]string `json:"labels,omitempty"`
}

// ChainReply is a replica's chain, keyed by layer name; the head is
// HeadName.
type ChainReply struct {
	VolumeSize int64            `json:"volumeSize"`
	Layers     map[string]Layer `json:"layers"`
}

// HeadName is the name the live head goes by in a chain.
const HeadName = "volume-head"

// PurgeStatusReply is a replica's purge progress.
type PurgeStatusReply struct {
	IsPurging bool   `json:"isPurging"`
	Progress  int    `json:"progress"`
	State     string `json:"state"`
	Error     string `json:"error,omitempty"`
}

// Extent is a run of data in a layer.
type Extent struct {
	Offset int64 `json:"offset"`
	Length int64 `json:"length"`
}
