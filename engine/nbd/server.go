package nbd

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/engine/blockdev"
)

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("nbd: server closed")

// Options configures a Server. The zero value is usable.
type Options struct {
	// Logger receives structured logs; default logrus.StandardLogger().
	Logger logrus.FieldLogger
	// MaxInflight bounds the requests one connection has in progress
	// (executing or with a reply queued); default 64.
	MaxInflight int
	// MaxInflightBytes bounds the payload bytes one connection holds in
	// progress; default 64 MiB. A single request larger than this still
	// runs, alone.
	MaxInflightBytes int
	// HandshakeTimeout bounds the option haggling phase; default 30s.
	HandshakeTimeout time.Duration
	// IgnoreNoHole makes WRITE_ZEROES with NBD_CMD_FLAG_NO_HOLE use
	// Device.WriteZeroes (which may deallocate) instead of writing zeros.
	IgnoreNoHole bool
}

// ExportOption configures an export.
type ExportOption func(*export)

// ReadOnly serves the export read-only: writes fail with EPERM.
func ReadOnly() ExportOption { return func(e *export) { e.readOnly = true } }

// Description sets the text returned for NBD_INFO_DESCRIPTION.
func Description(d string) ExportOption { return func(e *export) { e.description = d } }

// Default makes the export also answer to the empty (default) export name.
func Default() ExportOption { return func(e *export) { e.isDefault = true } }

// Growable makes an export for a device that may grow while clients are
// connected. NBD tells a client the size once, at the handshake, and has no
// way to tell it of a change; so this export advertises ceiling instead and
// checks every request against the device's size at that moment. A client
// that must see growth (a loop device over nbdfuse, whose file size is fixed
// when nbdfuse connects) limits itself to the real size and raises the limit
// when the device has grown. Requests beyond the real size fail with EINVAL.
func Growable(ceiling int64) ExportOption { return func(e *export) { e.growCeiling = ceiling } }

type export struct {
	name        string
	dev         blockdev.Device
	readOnly    bool
	description string
	isDefault   bool
	growCeiling int64 // advertised size of a Growable export; 0 for others
	conns       map[*conn]struct{}
}

// advertisedSize is the size told at the handshake.
func (e *export) advertisedSize() int64 {
	if e.growCeiling > 0 {
		return max(e.growCeiling, e.dev.Size())
	}
	return e.dev.Size()
}

// boundFor is the size a request is checked against: the size the client
// was told, or for a Growable export the device's size now.
func (e *export) boundFor(told int64) int64 {
	if e.growCeiling > 0 {
		return e.dev.Size()
	}
	return told
}

func (e *export) flags() uint16 {
	f := FlagHasFlags | FlagSendFlush | FlagSendFUA | FlagCanMultiConn
	if e.readOnly {
		f |= FlagReadOnly
	} else {
		f |= FlagSendTrim | FlagSendWriteZeroes
	}
	return f
}

// Server serves named exports over NBD. It is safe for concurrent use.
type Server struct {
	opts Options
	log  logrus.FieldLogger

	mu        sync.Mutex
	closed    bool
	exports   map[string]*export
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	wg        sync.WaitGroup // connections
	nextID    atomic.Uint64
}

// NewServer returns a server with no exports.
func NewServer(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = logrus.StandardLogger()
	}
	if opts.MaxInflight <= 0 {
		opts.MaxInflight = 64
	}
	if opts.MaxInflightBytes <= 0 {
		opts.MaxInflightBytes = 64 << 20
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = 30 * time.Second
	}
	return &Server{
		opts:      opts,
		log:       opts.Logger.WithField("component", "nbd"),
		exports:   map[string]*export{},
		listeners: map[net.Listener]struct{}{},
		conns:     map[*conn]struct{}{},
	}
}

// AddExport serves dev under name. The empty name is the default export;
// the Default option makes a named export answer to it as well.
func (s *Server) AddExport(name string, dev blockdev.Device, opts ...ExportOption) error {
	if len(name) > MaxStringLen {
		return fmt.Errorf("nbd: export name is %d bytes, limit %d", len(name), MaxStringLen)
	}
	if dev == nil {
		return fmt.Errorf("nbd: export %q: nil device", name)
	}
	e := &export{name: name, dev: dev, conns: map[*conn]struct{}{}}
	for _, o := range opts {
		o(e)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrServerClosed
	}
	if _, ok := s.exports[name]; ok {
		return fmt.Errorf("nbd: export %q already exists", name)
	}
	if e.isDefault {
		if d := s.defaultLocked(); d != nil {
			return fmt.Errorf("nbd: export %q cannot be the default: %q already is", name, d.name)
		}
	}
	s.exports[name] = e
	s.log.WithFields(logrus.Fields{"export": name, "size": dev.Size(), "readOnly": e.readOnly, "default": e.isDefault}).Info("Export added")
	return nil
}

// RemoveExport stops serving name: new connections can no longer select it
// and its live connections are closed. When it returns no request of those
// connections is still using the device.
func (s *Server) RemoveExport(name string) error {
	s.mu.Lock()
	e, ok := s.exports[name]
	if !ok {
		s.mu.Unlock()
		return fmt.Errorf("nbd: export %q not found", name)
	}
	delete(s.exports, name)
	conns := make([]*conn, 0, len(e.conns))
	for c := range e.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
	for _, c := range conns {
		<-c.done
	}
	s.log.WithFields(logrus.Fields{"export": name, "closedConns": len(conns)}).Info("Export removed")
	return nil
}

// Exports returns the export names, sorted.
func (s *Server) Exports() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.exports))
	for n := range s.exports {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func (s *Server) defaultLocked() *export {
	for _, e := range s.exports {
		if e.isDefault {
			return e
		}
	}
	return nil
}

func (s *Server) lookupLocked(name string) *export {
	if e, ok := s.exports[name]; ok {
		return e
	}
	if name == "" {
		return s.defaultLocked()
	}
	return nil
}

// lookup returns the export a client name selects, or nil.
func (s *Server) lookup(name string) *export {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lookupLocked(name)
}

// attach binds c to the export name selects, atomically with respect to
// RemoveExport and Close.
func (s *Server) attach(c *conn, name string) *export {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	e := s.lookupLocked(name)
	if e != nil {
		e.conns[c] = struct{}{}
		c.exp = e
	}
	return e
}

func (s *Server) detach(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.exp != nil {
		delete(c.exp.conns, c)
	}
	delete(s.conns, c)
}

// Serve accepts connections on l until Close; it returns ErrServerClosed
// after Close, or the listener's error.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		l.Close()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	log := s.log.WithField("listen", l.Addr().String())
	log.Info("Serving NBD")
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()
	var backoff time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return ErrServerClosed
			}
			var ne net.Error
			if (errors.As(err, &ne) && ne.Timeout()) || errors.Is(err, syscall.EMFILE) ||
				errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ENOBUFS) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				log.WithError(err).Warnf("Accept failed; retrying in %v", backoff)
				time.Sleep(backoff)
				continue
			}
			log.WithError(err).Error("Accept failed; no longer serving on this listener")
			return fmt.Errorf("nbd: accept on %s: %w", l.Addr(), err)
		}
		backoff = 0
		c := s.newConn(nc)
		if c == nil {
			continue
		}
		go c.serve()
	}
}

// ServeConn serves one already-accepted connection and returns when it ends.
func (s *Server) ServeConn(nc net.Conn) {
	if c := s.newConn(nc); c != nil {
		c.serve()
	}
}

func (s *Server) newConn(nc net.Conn) *conn {
	c := &conn{
		srv:  s,
		nc:   nc,
		done: make(chan struct{}),
		log: s.log.WithFields(logrus.Fields{
			"conn":   s.nextID.Add(1),
			"remote": nc.RemoteAddr().String(),
		}),
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		nc.Close()
		return nil
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	return c
}

// Close stops all listeners, closes every connection and waits until no
// request is using any device. Requests already executing finish first.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.closed = true
	var errs []error
	for l := range s.listeners {
		if err := l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("nbd: closing listener %s: %w", l.Addr(), err))
		}
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
	s.wg.Wait()
	s.log.WithField("closedConns", len(conns)).Info("NBD server closed")
	return errors.Join(errs...)
}
