package nbd

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/blockdev"
)

// growingDev is a device whose size grows on demand (as an engine's does
// during an online expansion), over a memory device of the largest size.
type growingDev struct {
	blockdev.Device
	size atomic.Int64
}

func (d *growingDev) Size() int64 { return d.size.Load() }

// A Growable export advertises its ceiling and checks each request against
// the device's size of the moment; a plain export of the same device keeps
// the size told at the handshake for the life of the connection.
func TestGrowableExport(t *testing.T) {
	const before, after, ceiling = 4 << 20, 8 << 20, 1 << 30
	dev := &growingDev{Device: blockdev.NewMem(after)}
	dev.size.Store(before)
	srv, addr, _ := testServer(t, Options{})
	require.NoError(t, srv.AddExport("vol", dev))
	require.NoError(t, srv.AddExport("vol+growable", dev, Growable(ceiling)))

	grow := connect(t, addr, "vol+growable")
	plain := connect(t, addr, "vol")
	assert.Equal(t, uint64(ceiling), grow.size, "the growable export advertises its ceiling")
	assert.Equal(t, uint64(before), plain.size)

	data := pattern(4096, 7)
	tests := []struct {
		name  string
		c     *client
		typ   uint16
		errno uint32
	}{
		{"growable: write beyond the device", grow, CmdWrite, ENOSPC},
		{"growable: read beyond the device", grow, CmdRead, EINVAL},
		{"plain: write beyond the size told", plain, CmdWrite, ENOSPC},
	}
	for _, tc := range tests {
		t.Run("before growing: "+tc.name, func(t *testing.T) {
			var payload []byte
			if tc.typ == CmdWrite {
				payload = data
			}
			errno, _ := tc.c.do(tc.typ, 0, 5<<20, uint32(len(data)), payload)
			assert.Equal(t, tc.errno, errno)
		})
	}

	dev.size.Store(after)
	grow.writeAt(data, 5<<20)
	assert.Equal(t, data, grow.read(5<<20, uint32(len(data))), "the grown range is served on the same connection")
	errno, _ := plain.do(CmdRead, 0, 5<<20, uint32(len(data)), nil)
	assert.Equal(t, EINVAL, errno, "a plain connection keeps the size it was told")
	errno, _ = grow.do(CmdWrite, 0, after, uint32(len(data)), data)
	assert.Equal(t, ENOSPC, errno, "still nothing beyond the device")
	fresh := connect(t, addr, "vol")
	assert.Equal(t, uint64(after), fresh.size, "a new plain connection is told the new size")
	assert.Equal(t, data, fresh.read(5<<20, uint32(len(data))))
}
