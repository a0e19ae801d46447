package benchbackup

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/internal/devtools/s3server"
)

// Two requests that ended together and share a line, or interleave across
// two lines, are both counted.
func TestRequestsSinceCountsMergedLines(t *testing.T) {
	dir := t.TempDir()
	log := "15:04:05 | vgw | 200 | 1.1ms | 127.0.0.1 | PUT | /backups/p/packs/ab/abc | 1 |\n" +
		"15:04:05 | vgw | 200 | 230.192µs | 127.0.0.1 | GET | /backups/p/index/abc | 2 |15:04:05 | vgw | 404 | 90µs | 127.0.0.1 | HEAD | /backups/p/x | 3 |\n" +
		"15:04:06 | vgw | 200 | 2ms | 127.0.0.1 | GET | /backups | 4 |\n" +
		"04:07:22 | vgw | 04:07:22 | vgw | 204 | 16.8ms | 127.0.0.1 | DELETE | /backups/p/obj-1 | 5 |\n" +
		"204 | 1m2.5s | 127.0.0.1 | DELETE | /backups/p/obj-2 | 6 |\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "versitygw.log"), []byte(log), 0o644))
	e := &env{s3: &s3server.Server{Dir: dir}}
	got, err := e.requestsSince(context.Background(), 0)
	require.NoError(t, err)
	assert.Equal(t, map[string]int64{"PUT": 1, "GET": 1, "HEAD": 1, "LIST": 1, "DELETE": 2}, got)
}
