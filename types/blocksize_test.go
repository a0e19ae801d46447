package types

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestRoundUpToBlock(t *testing.T) {
	tests := []struct {
		size   int64
		want   int64
		wantOK bool
	}{
		{0, 0, true},
		{1, BlockSize, true},
		{1000, 4096, true},
		{BlockSize, BlockSize, true},
		{BlockSize + 1, 2 * BlockSize, true},
		{1000000000, 1000001536, true},
		{math.MaxInt64 - BlockSize, math.MaxInt64 - BlockSize + 1, true},
		{math.MaxInt64 - BlockSize + 1, math.MaxInt64 - BlockSize + 1, true}, // the largest whole number of blocks
		{math.MaxInt64 - BlockSize + 2, math.MaxInt64 - BlockSize + 2, false},
		{math.MaxInt64, math.MaxInt64, false},
		{-1, -1, false},
	}
	for _, tc := range tests {
		got, ok := RoundUpToBlock(tc.size)
		assert.Equal(t, tc.wantOK, ok, "size %d", tc.size)
		assert.Equal(t, tc.want, got, "size %d", tc.size)
		if ok {
			assert.Zero(t, got%BlockSize, "size %d", tc.size)
		}
	}
}
