package fusefile

import (
	"bytes"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/blockdev"
	"github.com/strata-storage/strata/engine/replica"
)

// zeroRecorder is a device that records WriteZeroes calls.
type zeroRecorder struct {
	*blockdev.Mem
	zeroed [][2]int64
}

func (z *zeroRecorder) WriteZeroes(off, length int64) error {
	z.zeroed = append(z.zeroed, [2]int64{off, length})
	return z.Mem.WriteZeroes(off, length)
}

func newReq(op uint32, node uint64, in []byte, payload []byte) request {
	h := make([]byte, inHeaderSize)
	le.PutUint32(h[4:], op)
	le.PutUint64(h[8:], 7)
	le.PutUint64(h[16:], node)
	return request{header: h, in: in, payload: payload}
}

func rwIn(off uint64, size uint32) []byte {
	b := make([]byte, 40)
	le.PutUint64(b[8:], off)
	le.PutUint32(b[16:], size)
	return b
}

func fallocIn(off, length uint64, mode uint32) []byte {
	b := make([]byte, 32)
	le.PutUint64(b[8:], off)
	le.PutUint64(b[16:], length)
	le.PutUint32(b[24:], mode)
	return b
}

// Each opcode's answer, and what reaches the device.
func TestServe(t *testing.T) {
	const size = 1 << 20
	tests := []struct {
		name       string
		req        request
		wantStatus syscall.Errno
		wantLen    int
		wantZeroed [][2]int64
	}{
		{name: "lookup of the file", req: newReq(opLookup, rootID, nil, []byte("disk\x00")), wantLen: 128},
		{name: "lookup of another name", req: newReq(opLookup, rootID, nil, []byte("other\x00")), wantStatus: syscall.ENOENT},
		{name: "getattr", req: newReq(opGetattr, fileID, make([]byte, 16), nil), wantLen: 104},
		{name: "read inside", req: newReq(opRead, fileID, rwIn(4096, 8192), nil), wantLen: 8192},
		{name: "read across the end is short", req: newReq(opRead, fileID, rwIn(size-4096, 8192), nil), wantLen: 4096},
		{name: "read past the end is empty", req: newReq(opRead, fileID, rwIn(size, 4096), nil)},
		{name: "read larger than max write", req: newReq(opRead, fileID, rwIn(0, 1<<20+4096), nil), wantStatus: syscall.EINVAL},
		{name: "write inside", req: newReq(opWrite, fileID, rwIn(0, 4096), make([]byte, 4096)), wantLen: 8},
		{name: "write past the end", req: newReq(opWrite, fileID, rwIn(size, 4096), make([]byte, 4096)), wantStatus: syscall.ENOSPC},
		{name: "write with less data than it says", req: newReq(opWrite, fileID, rwIn(0, 8192), make([]byte, 4096)),
			wantStatus: syscall.EINVAL},
		{name: "punch hole", req: newReq(opFallocate, fileID, fallocIn(8192, 4096, fallocPunchHole|fallocKeepSize), nil),
			wantZeroed: [][2]int64{{8192, 4096}}},
		{name: "zero range", req: newReq(opFallocate, fileID, fallocIn(0, 65536, fallocZeroRange), nil),
			wantZeroed: [][2]int64{{0, 65536}}},
		{name: "allocate is a no-op", req: newReq(opFallocate, fileID, fallocIn(0, 4096, 0), nil)},
		{name: "collapse range is refused", req: newReq(opFallocate, fileID, fallocIn(0, 4096, 0x08), nil),
			wantStatus: syscall.EOPNOTSUPP},
		{name: "fallocate past the end", req: newReq(opFallocate, fileID, fallocIn(size-4096, 8192, fallocPunchHole), nil),
			wantStatus: syscall.EINVAL},
		{name: "fsync", req: newReq(opFsync, fileID, make([]byte, 16), nil)},
		{name: "xattrs are not supported", req: newReq(opGetxattr, fileID, make([]byte, 8), nil), wantStatus: syscall.EOPNOTSUPP},
		{name: "an unknown opcode", req: newReq(99, fileID, nil, nil), wantStatus: syscall.ENOSYS},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dev := &zeroRecorder{Mem: blockdev.NewMem(size)}
			s := &Server{name: "disk", dev: dev, log: logrus.New(), maxWrite: 1 << 20}
			out := make([]byte, 1<<20+4096)
			status, n := s.serve(tc.req, out)
			assert.Equal(t, -int32(tc.wantStatus), status)
			assert.Equal(t, tc.wantLen, n)
			assert.Equal(t, tc.wantZeroed, dev.zeroed)
		})
	}
}

// The directory lists ".", ".." and the file, and goes on from an offset.
func TestReaddir(t *testing.T) {
	s := &Server{name: "disk", dev: blockdev.NewMem(4096), log: logrus.New(), maxWrite: 4096}
	in := make([]byte, 40)
	le.PutUint32(in[16:], 4096)
	out := make([]byte, 4096)
	status, n := s.serve(newReq(opReaddir, rootID, in, nil), out)
	require.Zero(t, status)
	var names []string
	for off := 0; off < n; {
		l := int(le.Uint32(out[off+16:]))
		names = append(names, string(out[off+24:off+24+l]))
		off += (24 + l + 7) &^ 7
	}
	assert.Equal(t, []string{".", "..", "disk"}, names)

	le.PutUint64(in[8:], 2)
	_, n = s.serve(newReq(opReaddir, rootID, in, nil), out)
	assert.Equal(t, "disk", string(out[24:24+int(le.Uint32(out[16:]))]), "from offset 2, the file alone")
	assert.Equal(t, 32, n)
}

// headSize is the allocated bytes of the replica's head layer.
func headSize(t *testing.T, r *replica.Replica) int64 {
	t.Helper()
	info, err := r.Chain()
	require.NoError(t, err)
	for _, l := range info.Layers {
		if l.Name == replica.HeadName {
			return l.Size
		}
	}
	t.Fatal("no head in the chain")
	return 0
}

// A punched hole (how the loop device sends discards and write-zeroes)
// over data a snapshot of a replica holds reads back as zeros, leaves the
// snapshot's data alone and allocates nothing in the head (issue 43: a
// trim of 64 MiB under a kept snapshot allocated 64 MiB).
func TestPunchHoleOverSnapshotAllocatesNothing(t *testing.T) {
	const size, data = 32 << 20, 16 << 20
	r, err := replica.Create(filepath.Join(t.TempDir(), "r"), size, replica.CreateOptions{})
	require.NoError(t, err)
	defer r.Close()
	s := &Server{name: "disk", dev: r, log: logrus.New(), maxWrite: 1 << 20}
	out := make([]byte, 1<<20+4096)
	chunk := bytes.Repeat([]byte{0xab}, 1<<20)
	for off := uint64(0); off < data; off += 1 << 20 {
		status, _ := s.serve(newReq(opWrite, fileID, rwIn(off, 1<<20), chunk), out)
		require.Zero(t, status)
	}
	status, _ := s.serve(newReq(opFsync, fileID, make([]byte, 16), nil), out)
	require.Zero(t, status)
	require.NoError(t, r.Snapshot("s", replica.SnapshotOptions{}))
	before := headSize(t, r)

	status, _ = s.serve(newReq(opFallocate, fileID, fallocIn(0, data, fallocPunchHole|fallocKeepSize), nil), out)
	require.Zero(t, status)
	after := headSize(t, r)
	t.Logf("head: %d KiB before the punch, %d KiB after", before>>10, after>>10)
	assert.Less(t, after-before, int64(64<<10), "the punch allocates nothing but its marks")

	for off := uint64(0); off < data; off += 1 << 20 {
		status, n := s.serve(newReq(opRead, fileID, rwIn(off, 1<<20), nil), out)
		require.Zero(t, status)
		require.Equal(t, 1<<20, n)
		require.Equal(t, make([]byte, 1<<20), out[:n], "the hole reads zeros at %d", off)
	}
	snap := make([]byte, 1<<20)
	_, err = r.ReadLayer("s", snap, 3<<20)
	require.NoError(t, err)
	assert.Equal(t, chunk, snap, "the snapshot keeps its data")
}
