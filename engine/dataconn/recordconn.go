package dataconn

import (
	"crypto/tls"
	"net"
	"sync"
)

// gatherLimit is how many bytes of TLS records a held connection gathers
// before it writes them out anyway: 16 full records, one system call.
const gatherLimit = 256 << 10

// recordConn sits under crypto/tls on an encrypted data connection.
// crypto/tls writes every record (16 KiB of data at most) with a write of
// its own, so a 1 MiB frame cost 64 system calls; on these VMs the calls
// cost more than the AES-GCM itself (BenchmarkClient/tls). Between hold
// and release the records are gathered and written gatherLimit at a time.
// Writes outside a hold (the handshake, alerts, a key update answered by
// the reading side) go straight through, so nothing waits on a flush that
// may never come.
type recordConn struct {
	net.Conn

	mu   sync.Mutex
	held bool
	out  *[]byte // gathered records; from the payload pools, nil when empty
}

// Write is called by crypto/tls under its own output lock, so records
// reach out in the order they were sealed.
func (c *recordConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.held {
		return c.Conn.Write(p)
	}
	if c.out == nil {
		// Room for gatherLimit and the record that crosses it.
		c.out = getBuf(gatherLimit + maxRecord)
		*c.out = (*c.out)[:0]
	}
	*c.out = append(*c.out, p...)
	if len(*c.out) >= gatherLimit {
		return len(p), c.writeOutLocked()
	}
	return len(p), nil
}

// maxRecord bounds one TLS record on the wire: 16 KiB of data, the
// content type, the AEAD tag and the header, with room to spare.
const maxRecord = 16<<10 + 256

// hold gathers the records written from now until release.
func (c *recordConn) hold() {
	c.mu.Lock()
	c.held = true
	c.mu.Unlock()
}

// release writes what was gathered and stops gathering.
func (c *recordConn) release() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held = false
	return c.writeOutLocked()
}

// writeOutLocked writes the gathered records and returns the buffer to
// the pool, so an idle connection holds none.
func (c *recordConn) writeOutLocked() error {
	if c.out == nil {
		return nil
	}
	_, err := c.Conn.Write(*c.out)
	putBuf(c.out)
	c.out = nil
	return err
}

// gatheringTLS is an encrypted data connection whose frame writer gathers
// TLS records through rc.
type gatheringTLS struct {
	*tls.Conn
	rc *recordConn
}

func (g gatheringTLS) hold()          { g.rc.hold() }
func (g gatheringTLS) release() error { return g.rc.release() }

// gatherer is what a frame writer asks of a connection that can gather.
type gatherer interface {
	hold()
	release() error
}
