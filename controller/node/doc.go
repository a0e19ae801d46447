// Package node holds the node controller: the node's readiness, its disks'
// space and schedulability, and the cleanup of orphaned replica data.
package node
