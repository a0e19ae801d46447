package fsfreeze

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/strata-storage/strata/engine/nbd"
	"github.com/strata-storage/strata/internal/unixsock"
)

// The plugin answers the instance manager of its node on a unix socket in
// a root-only directory both mount; only root's (and the plugin's own
// user's) processes get through (SO_PEERCRED). HTTP with JSON bodies: two
// verbs, no schema worth a gRPC service of its own.

// Request asks for a freeze (TimeoutMs set) or a thaw.
type Request struct {
	Volume    string `json:"volume"`
	ID        string `json:"id"`
	TimeoutMs int64  `json:"timeoutMs,omitempty"`
}

// Reply answers a freeze.
type Reply struct {
	Consistency Consistency `json:"consistency,omitempty"`
	Error       string      `json:"error,omitempty"`
	Expired     bool        `json:"expired,omitempty"`
}

// maxRequest bounds what is read of a request body.
const maxRequest = 4 << 10

// Serve answers on the unix socket at path until ctx ends.
func (f *Freezer) Serve(ctx context.Context, path string) error {
	ul, err := unixsock.Listen(path, unixsock.Options{DirMode: 0o700, Mode: 0o600})
	if err != nil {
		return fmt.Errorf("freeze socket %s: %w", path, err)
	}
	l := nbd.PeerUIDListener(ul, f.log, nbd.OwnUIDs()...)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/freeze", f.handle(func(ctx context.Context, r Request) (Reply, error) {
		c, err := f.Freeze(ctx, r.Volume, r.ID, time.Duration(r.TimeoutMs)*time.Millisecond)
		return Reply{Consistency: c}, err
	}))
	mux.HandleFunc("POST /v1/thaw", f.handle(func(_ context.Context, r Request) (Reply, error) {
		return Reply{}, f.Thaw(r.Volume, r.ID)
	}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func (f *Freezer) handle(fn func(context.Context, Request) (Reply, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req Request
		reply, code := Reply{}, http.StatusOK
		if err := json.NewDecoder(io.LimitReader(r.Body, maxRequest)).Decode(&req); err != nil {
			reply.Error, code = "request body: "+err.Error(), http.StatusBadRequest
		} else if reply, err = fn(r.Context(), req); err != nil {
			reply.Error, reply.Expired, code = err.Error(), errors.Is(err, ErrExpired), http.StatusConflict
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(reply)
	}
}

// Client asks a node plugin's freezer over its socket.
type Client struct {
	http *http.Client
}

// NewClient talks to the freezer at socket.
func NewClient(socket string) *Client {
	var d net.Dialer
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return d.DialContext(ctx, "unix", socket)
	}, MaxIdleConns: 2}
	return &Client{http: &http.Client{Transport: tr}}
}

// ErrNoPlugin: nothing answers on the socket (no CSI node plugin on this
// node, or it is restarting).
var ErrNoPlugin = errors.New("no CSI node plugin answers for filesystem freezes")

// Freeze asks for volume to be frozen for cut id.
func (c *Client) Freeze(ctx context.Context, volume, id string, timeout time.Duration) (Consistency, error) {
	reply, err := c.call(ctx, "freeze", Request{Volume: volume, ID: id, TimeoutMs: timeout.Milliseconds()})
	return reply.Consistency, err
}

// Thaw ends the freeze of volume for cut id; ErrExpired if it had ended.
func (c *Client) Thaw(ctx context.Context, volume, id string) error {
	_, err := c.call(ctx, "thaw", Request{Volume: volume, ID: id})
	return err
}

func (c *Client) call(ctx context.Context, verb string, r Request) (Reply, error) {
	body, _ := json.Marshal(r)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://fsfreeze/v1/"+verb, bytes.NewReader(body))
	if err != nil {
		return Reply{}, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		// No socket file: no plugin on this node, the cut is crash-consistent.
		// A socket nothing answers on (a plugin killed, restarting) is an
		// error: the volume may well be mounted, and the caller retries.
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" && errors.Is(err, syscall.ENOENT) {
			return Reply{}, fmt.Errorf("%w: %v", ErrNoPlugin, err)
		}
		return Reply{}, fmt.Errorf("asking the CSI node plugin to %s %s: %w", verb, r.Volume, err)
	}
	defer resp.Body.Close()
	var reply Reply
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxRequest)).Decode(&reply); err != nil {
		return Reply{}, fmt.Errorf("%s of %s: reply: %w", verb, r.Volume, err)
	}
	switch {
	case reply.Expired:
		return reply, fmt.Errorf("%s: %w", reply.Error, ErrExpired)
	case resp.StatusCode != http.StatusOK:
		return reply, errors.New(reply.Error)
	}
	return reply, nil
}
