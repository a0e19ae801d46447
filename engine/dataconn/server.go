package dataconn

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/engine/blockdev"
)

// Handler is what a server exposes: a block device plus control calls.
// Control gets the method name and raw JSON arguments (nil when there are
// none) and returns a JSON result; this package gives them no meaning.
// Wrap ErrUnknownMethod, ErrInvalidArgument or ErrNotFound so the client
// can tell those failures apart.
type Handler interface {
	blockdev.Device
	Control(ctx context.Context, method string, args json.RawMessage) (json.RawMessage, error)
}

// ServerOption tunes a Server.
type ServerOption func(*serverConfig)

type serverConfig struct {
	maxInFlight      int
	maxInFlightBytes int64
	tls              *tls.Config
}

// handshakeTimeout bounds a TLS handshake, so that a peer that connects and
// says nothing holds no goroutine for long.
const handshakeTimeout = 10 * time.Second

// WithTLS makes every connection a TLS server connection with cfg (whose
// client-certificate checks decide who may connect); a failed handshake
// closes the connection before any frame is read.
func WithTLS(cfg *tls.Config) ServerOption {
	cfg = cfg.Clone()
	// A TLS 1.3 server sends session tickets after the handshake; a
	// connection that goes on unencrypted (negotiate) must see no TLS
	// record after the mode byte.
	cfg.SessionTicketsDisabled = true
	return func(c *serverConfig) { c.tls = cfg }
}

// WithMaxInFlight bounds the requests one connection has admitted and not
// yet answered (default 32). It bounds concurrency and memory per
// connection; a client that sends more simply waits in TCP.
func WithMaxInFlight(n int) ServerOption {
	return func(c *serverConfig) {
		if n > 0 {
			c.maxInFlight = n
		}
	}
}

// WithMaxInFlightBytes bounds the payload bytes one connection holds for
// admitted requests (default 64 MiB). One request is always admitted.
func WithMaxInFlightBytes(n int64) ServerOption {
	return func(c *serverConfig) {
		if n > 0 {
			c.maxInFlightBytes = n
		}
	}
}

// Server serves one Handler to any number of connections.
type Server struct {
	handler Handler
	log     logrus.FieldLogger
	cfg     serverConfig
	ctx     context.Context // parent of Control calls; cancelled by Close
	cancel  context.CancelFunc

	mu        sync.Mutex
	closed    bool
	listeners map[net.Listener]struct{}
	conns     map[*serverConn]struct{}
	wg        sync.WaitGroup // connections

	// unordered drops every ordering rule (barriers, overlapping requests).
	// Tests set it to prove the ordering tests catch a broken server;
	// nothing else may.
	unordered bool
}

// NewServer returns a server for handler; call Serve to accept connections.
func NewServer(handler Handler, log logrus.FieldLogger, opts ...ServerOption) *Server {
	if log == nil {
		log = logrus.StandardLogger()
	}
	cfg := serverConfig{maxInFlight: 32, maxInFlightBytes: 64 << 20}
	for _, o := range opts {
		o(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{
		handler:   handler,
		log:       log.WithField("component", "dataconn-server"),
		cfg:       cfg,
		ctx:       ctx,
		cancel:    cancel,
		listeners: map[net.Listener]struct{}{},
		conns:     map[*serverConn]struct{}{},
	}
}

// Serve accepts connections on l until l fails or the server is closed. It
// returns ErrServerClosed after Close, and closes l in every case.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		l.Close()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
		l.Close()
	}()

	log := s.log.WithField("listen", l.Addr().String())
	log.Info("Serving data connections")
	var backoff time.Duration
	for {
		conn, err := l.Accept()
		if err != nil {
			if s.isClosed() {
				return ErrServerClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Transient failures (EMFILE, ECONNABORTED) must not take the
			// replica offline; back off and keep accepting.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			log.WithError(err).Warnf("Accept failed; retrying in %v", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		s.startConn(conn)
	}
}

// handshake turns sc's connection into a TLS one; false (connection closed,
// refusal logged) when the peer does not pass.
func (s *Server) handshake(sc *serverConn) bool {
	raw := sc.conn
	ctx, cancel := context.WithTimeout(s.ctx, handshakeTimeout)
	defer cancel()
	conn, err := serverHandshake(ctx, raw, s.cfg.tls)
	if err != nil {
		s.log.WithError(err).WithField("remote", raw.RemoteAddr().String()).Warn("Refused a data connection")
		raw.Close()
		return false
	}
	sc.setConn(conn)
	return true
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *Server) startConn(conn net.Conn) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		conn.Close()
		return
	}
	sc := newServerConn(s, conn)
	s.conns[sc] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()

	go func() {
		defer s.wg.Done()
		if s.cfg.tls != nil && !s.handshake(sc) {
			s.mu.Lock()
			delete(s.conns, sc)
			s.mu.Unlock()
			return
		}
		sc.run()
		s.mu.Lock()
		delete(s.conns, sc)
		s.mu.Unlock()
	}()
}

// Close stops accepting, closes every connection (their pending requests
// fail on the client with ErrConnectionClosed), cancels running Control
// calls and waits for in-progress device calls to return.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for l := range s.listeners {
		l.Close()
	}
	for sc := range s.conns {
		sc.conn.Close()
	}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	return nil
}
