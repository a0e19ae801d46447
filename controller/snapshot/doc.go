// Package snapshot holds the snapshot controller (create, remove, revert,
// purge, freeze of a mounted filesystem) and the snapshot group controller
// (crash-consistent snapshots of several volumes).
package snapshot
