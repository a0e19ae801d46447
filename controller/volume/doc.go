// Package volume holds the volume controller (scheduling, replicas, data
// locality, snapshot-limit and space conditions, expansion) and the clone
// controller that fills a volume from another volume's snapshot.
package volume
