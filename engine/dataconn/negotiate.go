package dataconn

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"time"
)

// After the TLS handshake the client says, inside TLS, whether the frames
// go on encrypted or in the clear, and the server confirms. Go's TLS has no
// null cipher, so "authenticated but not encrypted" is done here: both ends
// are proven by the handshake (certificates of the Strata CA, identities
// checked), then the raw TCP connection carries the frames. The order makes
// the switch safe: the server sends no TLS record after its confirmation
// (session tickets are off) and the client sends no clear frame before it
// reads the confirmation, so neither side's TLS layer has buffered bytes of
// the clear stream. What this gives up is protection against an on-path
// attacker who can inject into an established TCP stream.
const (
	modeEncrypted   byte = 'E'
	modeUnencrypted byte = 'P'
	modeConfirmed   byte = 'K'
)

func clientHandshake(ctx context.Context, raw net.Conn, opts Options) (net.Conn, error) {
	rc := &recordConn{Conn: raw}
	tc := tls.Client(rc, opts.TLS)
	out := net.Conn(gatheringTLS{Conn: tc, rc: rc})
	err := negotiate(ctx, raw, func() error {
		if err := tc.HandshakeContext(ctx); err != nil {
			return err
		}
		mode := modeEncrypted
		if opts.Unencrypted {
			mode = modeUnencrypted
		}
		if _, err := tc.Write([]byte{mode}); err != nil {
			return err
		}
		var ok [1]byte
		if _, err := io.ReadFull(tc, ok[:]); err != nil {
			return fmt.Errorf("waiting for the server to confirm: %w", err)
		}
		if ok[0] != modeConfirmed {
			return fmt.Errorf("server confirmed with %q", ok[0])
		}
		if opts.Unencrypted {
			out = raw
		}
		return nil
	})
	if err != nil {
		raw.Close()
		return nil, err
	}
	return out, nil
}

func serverHandshake(ctx context.Context, raw net.Conn, cfg *tls.Config) (net.Conn, error) {
	rc := &recordConn{Conn: raw}
	tc := tls.Server(rc, cfg)
	out := net.Conn(gatheringTLS{Conn: tc, rc: rc})
	err := negotiate(ctx, raw, func() error {
		if err := tc.HandshakeContext(ctx); err != nil {
			return err
		}
		var mode [1]byte
		if _, err := io.ReadFull(tc, mode[:]); err != nil {
			return fmt.Errorf("reading the client's mode: %w", err)
		}
		switch mode[0] {
		case modeEncrypted:
		case modeUnencrypted:
			out = raw
		default:
			return fmt.Errorf("unknown mode %q", mode[0])
		}
		_, err := tc.Write([]byte{modeConfirmed})
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// negotiate runs steps under ctx's deadline on raw and clears the deadline
// afterwards.
func negotiate(ctx context.Context, raw net.Conn, steps func() error) error {
	if d, ok := ctx.Deadline(); ok {
		_ = raw.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { _ = raw.SetDeadline(time.Unix(1, 0)) })
	err := steps()
	stop()
	_ = raw.SetDeadline(time.Time{})
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return err
}
