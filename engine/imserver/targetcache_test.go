package imserver

import (
	"crypto/sha256"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/strata-storage/strata/internal/backupstore"
)

// The open backup targets are bounded: the least recently used goes first.
func TestTargetCacheIsBounded(t *testing.T) {
	var c targetCache
	key := func(i int) [sha256.Size]byte { return sha256.Sum256([]byte{byte(i)}) }
	targets := make([]*backupstore.Target, maxCachedTargets+1)
	for i := range targets {
		targets[i] = &backupstore.Target{}
	}
	for i := range maxCachedTargets {
		assert.Same(t, targets[i], c.add(key(i), targets[i]))
	}
	assert.Same(t, targets[0], c.get(key(0)), "0 is used again: 1 is now the oldest")
	assert.Same(t, targets[0], c.add(key(0), &backupstore.Target{}), "a second open of the same identity shares the first")
	c.add(key(maxCachedTargets), targets[maxCachedTargets])
	assert.Len(t, c.entries, maxCachedTargets)
	assert.Nil(t, c.get(key(1)), "the least recently used was evicted")
	assert.Same(t, targets[0], c.get(key(0)))
	assert.Same(t, targets[maxCachedTargets], c.get(key(maxCachedTargets)))
}
