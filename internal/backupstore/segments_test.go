package backupstore

import (
	"bytes"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSegmentReaderReadsAndSeeksAcrossSegments(t *testing.T) {
	segs := [][]byte{[]byte("ab"), nil, []byte("cde"), []byte("f"), {}}
	whole := []byte("abcdef")
	tests := []struct {
		name   string
		offset int64
		whence int
		want   string
	}{
		{"from the start", 0, io.SeekStart, "abcdef"},
		{"inside a segment", 3, io.SeekStart, "def"},
		{"at a segment's start", 2, io.SeekStart, "cdef"},
		{"from the end", -1, io.SeekEnd, "f"},
		{"at the end", 0, io.SeekEnd, ""},
		{"past the end", 9, io.SeekStart, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newSegmentReader(segs)
			_, err := io.CopyN(io.Discard, r, 4) // read some first: Seek must reset
			require.NoError(t, err)
			_, err = r.Seek(tc.offset, tc.whence)
			require.NoError(t, err)
			got, err := io.ReadAll(r)
			require.NoError(t, err)
			assert.Equal(t, tc.want, string(got))
		})
	}
	t.Run("one byte at a time", func(t *testing.T) {
		got, err := io.ReadAll(io.LimitReader(newSegmentReader(segs), 100))
		require.NoError(t, err)
		assert.True(t, bytes.Equal(whole, got))
		var one [1]byte
		r := newSegmentReader(segs)
		var out []byte
		for {
			n, err := r.Read(one[:])
			out = append(out, one[:n]...)
			if err == io.EOF {
				break
			}
			require.NoError(t, err)
		}
		assert.Equal(t, whole, out)
		cur, err := r.Seek(0, io.SeekCurrent)
		require.NoError(t, err)
		assert.EqualValues(t, 6, cur)
	})
	t.Run("a negative position is refused", func(t *testing.T) {
		_, err := newSegmentReader(segs).Seek(-1, io.SeekStart)
		assert.ErrorContains(t, err, "negative")
	})
}
