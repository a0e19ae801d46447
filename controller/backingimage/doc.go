// Package backingimage holds the backing image controller: downloads,
// uploads, exports and the copies of each image on the nodes' disks.
package backingimage
