package imagefile

import (
	"context"
	"io"
)

// Limits bound what preparing a source may cost a node. A hostile image is
// small on the wire and huge once unpacked (a nested xz of zeros; a qcow2
// that claims 16 TiB and holds one of the node's two transfer slots for
// hours while its holes are checksummed). The zero value is the defaults.
type Limits struct {
	// MaxVirtualSize is the largest raw image taken, in bytes: a qcow2's
	// virtual size, a raw file's size, a decompressed raw stream. 0 means
	// DefaultMaxVirtualSize.
	MaxVirtualSize int64
}

// DefaultMaxVirtualSize is 1 TiB: far above any OS or application image,
// far below the 16 TiB a volume may have (an admin with bigger images
// raises the setting backing-image-max-virtual-size).
const DefaultMaxVirtualSize int64 = 1 << 40

func (l Limits) maxVirtualSize() int64 {
	if l.MaxVirtualSize > 0 {
		return l.MaxVirtualSize
	}
	return DefaultMaxVirtualSize
}

// maxDecompressed is the most bytes one decompression stage may write. The
// stage is either the raw image or a qcow2 of it, and a qcow2 is its data
// plus its L2 and refcount tables (under 2 % of the virtual size even with
// 512-byte clusters), so a sixteenth on top leaves room for any real one.
func (l Limits) maxDecompressed() int64 {
	v := l.maxVirtualSize()
	return v + v/16
}

// ctxReader makes a long read loop (a decompression, the checksum of a
// terabyte) stop when its context ends: io.Copy and its kin never look at
// one, and a cancelled transfer must give its slot back at once.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// cappedReader fails the read that would take it past max bytes, so a
// decompression bomb stops at the cap, having written no more than that,
// rather than at a full disk. tooLarge makes the error.
type cappedReader struct {
	r        io.Reader
	n, max   int64
	tooLarge func() error
}

func (c *cappedReader) Read(p []byte) (int, error) {
	if left := c.max - c.n + 1; int64(len(p)) > left {
		p = p[:left] // one byte past the cap is enough to know
	}
	k, err := c.r.Read(p)
	c.n += int64(k)
	if c.n > c.max {
		return 0, c.tooLarge()
	}
	return k, err
}
