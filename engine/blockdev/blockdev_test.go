package blockdev

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheckRange(t *testing.T) {
	tests := []struct {
		off, length, size int64
		ok                bool
	}{
		{0, 0, 0, true}, {0, 10, 10, true}, {5, 5, 10, true}, {10, 0, 10, true},
		{-1, 1, 10, false}, {0, -1, 10, false}, {5, 6, 10, false}, {11, 0, 10, false},
		{1, 1<<63 - 1, 10, false}, // no overflow
	}
	for _, tc := range tests {
		err := CheckRange(tc.off, tc.length, tc.size)
		assert.Equal(t, tc.ok, err == nil, "off=%d len=%d size=%d: %v", tc.off, tc.length, tc.size, err)
		if err != nil {
			assert.True(t, errors.Is(err, ErrOutOfRange))
		}
	}
}

func TestDevices(t *testing.T) {
	file, err := OpenFile(filepath.Join(t.TempDir(), "raw"), 1<<20)
	require.NoError(t, err)
	defer file.Close()
	for name, dev := range map[string]Device{"mem": NewMem(1 << 20), "file": file} {
		t.Run(name, func(t *testing.T) {
			data := bytes.Repeat([]byte{0xab}, 3*BlockSize+7)
			_, err := dev.WriteAt(data, 1000)
			require.NoError(t, err)
			got := make([]byte, len(data))
			_, err = dev.ReadAt(got, 1000)
			require.NoError(t, err)
			assert.Equal(t, data, got)

			require.NoError(t, dev.WriteZeroes(BlockSize, BlockSize))
			_, err = dev.ReadAt(got, 1000)
			require.NoError(t, err)
			assert.Equal(t, make([]byte, BlockSize), got[BlockSize-1000:2*BlockSize-1000])
			assert.Equal(t, byte(0xab), got[0])

			_, err = dev.WriteAt([]byte{1}, 1<<20)
			assert.ErrorIs(t, err, ErrOutOfRange)
			require.NoError(t, dev.Flush())
		})
	}
}
