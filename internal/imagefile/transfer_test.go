package imagefile

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestExtentStreamOverHTTP(t *testing.T) {
	dir := t.TempDir()
	img := rawImage(t)
	src := filepath.Join(dir, "src")
	require.NoError(t, writeSparseFile(src, bytes.NewReader(img)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = WriteExtents(r.Context(), w, src)
	}))
	defer srv.Close()

	dst := filepath.Join(dir, "dst")
	var last int64
	require.NoError(t, FetchExtents(context.Background(), nil, srv.URL, dst, func(done, total int64) {
		assert.Equal(t, int64(imageSize), total)
		last = done
	}))
	got, err := os.ReadFile(dst)
	require.NoError(t, err)
	assert.Equal(t, sha(img), sha(got))
	assert.Equal(t, int64(3*64<<10), last, "only the data extents travel")
	assert.Less(t, allocated(t, dst), int64(imageSize/2), "holes stay holes")
	_, err = os.Stat(dst + ".tmp")
	assert.True(t, os.IsNotExist(err))
}

func TestReadExtentsRefusesDamagedStreams(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	require.NoError(t, writeSparseFile(src, bytes.NewReader(rawImage(t))))
	var full bytes.Buffer
	require.NoError(t, WriteExtents(context.Background(), &full, src))
	stream := full.Bytes()

	tests := []struct {
		name   string
		stream []byte
		want   string
	}{
		{"cut short", stream[:len(stream)-20], "before its end mark"},
		{"no end mark", stream[:len(stream)-16], "before its end mark"},
		{"not a stream", []byte("<html>hello there, not an image</html>"), "not an extent stream"},
		{"frame past the end", func() []byte {
			b := bytes.Clone(stream)
			b[16+1] = 0xff // first frame's offset: far past the size
			return b
		}(), "outside"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := filepath.Join(dir, "dst-"+tt.name)
			err := ReadExtents(context.Background(), bytes.NewReader(tt.stream), dst, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			_, statErr := os.Stat(dst)
			assert.True(t, os.IsNotExist(statErr), "no file from a damaged stream")
			_, statErr = os.Stat(dst + ".tmp")
			assert.True(t, os.IsNotExist(statErr), "no work file left")
		})
	}
}
