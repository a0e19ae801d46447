package s3server

import (
	"context"
	"io"
	"net"
	"sync"

	"golang.org/x/time/rate"
)

// Throttle is a TCP proxy on loopback that forwards to an S3 server at a
// limited rate in both directions, so a test can land a fault in the middle
// of a backup or a restore of a few tens of MiB instead of hundreds. It
// works below HTTP: SigV4 signs the Host header the client sends, which a
// byte-for-byte proxy leaves as it is. It keeps forwarding to the same
// address across the server's Stop and Restart.
type Throttle struct {
	// Endpoint is http://127.0.0.1:<port> of the proxy.
	Endpoint string

	target  string
	ln      net.Listener
	limiter *rate.Limiter
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	closed  bool
}

// chunk is the most one read forwards at once; it is also the limiter's
// burst, so a slow rate is felt within one chunk.
const chunk = 32 << 10

// NewThrottle proxies to s at bytesPerSecond (shared by every connection
// and both directions; 0 or less: full speed).
func NewThrottle(s *Server, bytesPerSecond int) (*Throttle, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	t := &Throttle{Endpoint: "http://" + ln.Addr().String(), target: s.addr, ln: ln,
		limiter: rate.NewLimiter(rate.Inf, chunk), conns: map[net.Conn]struct{}{}}
	t.SetRate(bytesPerSecond)
	t.wg.Add(1)
	go t.accept()
	return t, nil
}

// SetRate changes the rate for every connection, open or new (0 or less:
// full speed).
func (t *Throttle) SetRate(bytesPerSecond int) {
	if bytesPerSecond <= 0 {
		t.limiter.SetLimit(rate.Inf)
		return
	}
	t.limiter.SetLimit(rate.Limit(bytesPerSecond))
}

// Close stops accepting, cuts every open connection and waits for the
// forwarding goroutines.
func (t *Throttle) Close() error {
	err := t.ln.Close()
	t.mu.Lock()
	t.closed = true
	for c := range t.conns {
		c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
	return err
}

// track records an open connection so Close can cut it; one opened after
// Close is cut at once, so Close never waits on a connection it missed.
func (t *Throttle) track(c net.Conn, open bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case open && t.closed:
		c.Close()
	case open:
		t.conns[c] = struct{}{}
	default:
		delete(t.conns, c)
	}
}

func (t *Throttle) accept() {
	defer t.wg.Done()
	for {
		client, err := t.ln.Accept()
		if err != nil {
			return
		}
		t.wg.Add(1)
		go t.serve(client)
	}
}

// serve forwards one connection; when either side ends, both do, as a
// client of the real server would see it.
func (t *Throttle) serve(client net.Conn) {
	defer t.wg.Done()
	server, err := net.Dial("tcp", t.target)
	if err != nil {
		client.Close()
		return
	}
	t.track(client, true)
	t.track(server, true)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		t.copy(dst, src)
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done
	<-done
	t.track(client, false)
	t.track(server, false)
}

func (t *Throttle) copy(dst io.Writer, src io.Reader) {
	buf := make([]byte, chunk)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if t.limiter.WaitN(context.Background(), n) != nil {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
