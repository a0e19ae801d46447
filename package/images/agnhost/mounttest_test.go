package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The lines the subPath suite matches, in the order it relies on: a new
// file is written, then its mode and content are read.
func TestMounttestWritesThenReports(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	var out bytes.Buffer
	code := mounttest([]string{"--new_file_0644=" + a, "--new_file_0666=" + b, "--file_mode=" + a, "--file_perm=" + b,
		"--file_content=" + a}, &out, noSleep(t))
	require.Equal(t, 0, code, out.String())
	assert.Equal(t, strings.Join([]string{
		`content of file "` + a + `": mount-tester new file`, "",
		`content of file "` + b + `": mount-tester new file`, "",
		`mode of file "` + a + `": -rw-r--r--`,
		`perms of file "` + b + `": -rw-rw-rw-`,
		`content of file "` + a + `": mount-tester new file`, "", "",
	}, "\n"), out.String())
	info, err := os.Stat(b)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o666), info.Mode().Perm(), "whatever the umask")
}

func TestMounttestFailures(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none", "x")
	for name, args := range map[string][]string{
		"unwritable new file":     {"--new_file_0644=" + missing},
		"mode of a missing file":  {"--file_mode=" + missing},
		"owner of a missing file": {"--file_owner=" + missing},
	} {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			assert.Equal(t, 1, mounttest(args, &out, noSleep(t)))
			assert.Contains(t, out.String(), missing)
		})
	}
	var out bytes.Buffer
	assert.Equal(t, 2, mounttest([]string{"--no_such_flag=x"}, &out, noSleep(t)))
	assert.Equal(t, 2, mounttest([]string{"stray"}, &out, noSleep(t)))
}

// --file_content_in_loop polls every 2 s until the file holds the new-file
// content (written by another container meanwhile), or gives up at
// --retry_time with the last error.
func TestMounttestContentInLoop(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	var slept time.Duration
	sleep := func(d time.Duration) {
		slept += d
		switch slept {
		case 2 * time.Second:
			require.NoError(t, os.WriteFile(path, []byte("other\n"), 0o644))
		case 4 * time.Second:
			require.NoError(t, os.WriteFile(path, []byte(newFileContent), 0o644))
		}
	}
	var out bytes.Buffer
	require.Equal(t, 0, mounttest([]string{"--file_content_in_loop=" + path, "--retry_time=60"}, &out, sleep), out.String())
	assert.Equal(t, 4*time.Second, slept)
	assert.Contains(t, out.String(), "Error reading file "+path)
	assert.Contains(t, out.String(), "Unexpected content.")
	assert.True(t, strings.HasSuffix(out.String(), `content of file "`+path+"\": mount-tester new file\n\n"), out.String())

	slept = 0
	out.Reset()
	gone := filepath.Join(t.TempDir(), "never")
	assert.Equal(t, 1, mounttest([]string{"--file_content_in_loop=" + gone, "--retry_time=6"}, &out, func(d time.Duration) { slept += d }))
	assert.Equal(t, 4*time.Second, slept, "three reads, 2 s apart, within 6 s")
}

func noSleep(t *testing.T) func(time.Duration) {
	return func(time.Duration) { t.Fatal("no check here waits") }
}
