package dataplane

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/strata-storage/strata/engineapi"
)

// kill -9 of an instance manager while a client streams direct writes into
// the volume's file (--fuse-dir): the client gets errors, not a hang; the
// dead mount is cleaned up when the instance manager comes back, the file
// is served again with the engine, and every write acknowledged before the
// kill reads back through it and through NBD.
func TestInstanceManagerKilledWhileServingTheFile(t *testing.T) {
	const chunk, killAfter = 1 << 20, 12
	n := startNodeWith(t, "fuse1", true)
	v := createVolume(t, "fusek", []*node{n})
	file := engineapi.FUSEFile(n.fuseDir, v.name)

	fd, err := unix.Open(file, unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	acked := make(chan int, volSize/chunk)
	ended := make(chan error, 1)
	go func() {
		defer close(acked)
		buf := alignedBuffer(chunk)
		for i := 0; i < volSize/chunk; i++ {
			copy(buf, bytes.Repeat([]byte{byte(i + 1)}, chunk))
			if _, err := unix.Pwrite(fd, buf, int64(i)*chunk); err != nil {
				ended <- err
				return
			}
			acked <- i
		}
		ended <- nil
	}()
	var got []int
	for i := range acked {
		got = append(got, i)
		if len(got) == killAfter {
			require.NoError(t, n.proc.Kill(), "kill -9 the instance manager serving the file")
		}
	}
	writeErr := <-ended
	require.Error(t, writeErr, "writes after the kill fail")
	t.Logf("%d writes acknowledged; the next failed with %v", len(got), writeErr)
	_ = unix.Close(fd)
	_, err = os.Stat(file)
	require.ErrorIs(t, err, syscall.ENOTCONN, "the dead server's mount is left behind")

	n.start(t)
	_, err = os.Stat(filepath.Dir(file))
	assert.ErrorIs(t, err, os.ErrNotExist, "the restarted instance manager unmounted and removed it")
	list, err := n.client(t).InstanceList(t.Context())
	require.NoError(t, err)
	require.Len(t, list, 1, "the replica is reopened; the engine is not")
	v.replicas[list[0].Name] = list[0].Address
	v.startEngine(t)

	rfd, err := unix.Open(file, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	require.NoError(t, err, "the file is served again with the engine")
	defer unix.Close(rfd)
	buf := alignedBuffer(chunk)
	var cmds []string
	for _, i := range got {
		_, err := unix.Pread(rfd, buf, int64(i)*chunk)
		require.NoError(t, err)
		require.Equal(t, bytes.Repeat([]byte{byte(i + 1)}, chunk), buf, "acknowledged chunk %d through the file", i)
		cmds = append(cmds, fmt.Sprintf("read -P %d %d %d", i+1, i*chunk, chunk))
	}
	assert.NotContains(t, qemuIO(t, v.endpoint, cmds...), "verification failed", "and through NBD")
}

// alignedBuffer returns n bytes at a 4096-byte boundary, as O_DIRECT needs.
func alignedBuffer(n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		panic(err)
	}
	return b
}
