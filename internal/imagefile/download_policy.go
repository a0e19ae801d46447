package imagefile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"
)

// DownloadPolicy bounds a download from a URL a user gave: the server is
// outside Strata and may be slow, stalled, endless, or may send the
// manager to the node's own services, the cloud metadata endpoint or the
// cluster's internal networks. Zero fields take the defaults.
type DownloadPolicy struct {
	// MaxSize caps the bytes of the source (before any decompression).
	MaxSize int64
	// Refused adds to the ranges refused by default (refusedByDefault)
	// those only the caller knows: the node's and the cluster's addresses,
	// the cluster's Pod and Service ranges.
	Refused []RefusedRange
	// Allowed and AllowedHosts admit what would be refused, defaults
	// included: an address in Allowed, and any address a host name in
	// AllowedHosts (matched in any case) resolves to. A host name trusts
	// its DNS: whoever answers for the name chooses where it leads.
	Allowed      []netip.Prefix
	AllowedHosts []string
	// AllowedBy names, in a refusal, what admits an address (the
	// manager's setting); empty: "the download policy's allowlist".
	AllowedBy string
	// ConnectTimeout bounds a TCP connect and a TLS handshake.
	ConnectTimeout time.Duration
	// StallTimeout: no byte for this long (response headers included)
	// fails the attempt; the next one resumes with a Range request.
	StallTimeout time.Duration
	// Timeout bounds one attempt from start to end; resumed likewise.
	Timeout time.Duration

	// resolver, when set, replaces the system's (tests: a DNS answer
	// that changes between two dials).
	resolver *net.Resolver
}

const (
	// DefaultMaxDownloadSize matches the manager's --upload-size-limit.
	DefaultMaxDownloadSize int64 = 256 << 30
	DefaultConnectTimeout        = 30 * time.Second
	DefaultStallTimeout          = time.Minute
	DefaultDownloadTimeout       = 12 * time.Hour
	maxRedirects                 = 5
)

func (p DownloadPolicy) maxSize() int64 { return orDefault(p.MaxSize, DefaultMaxDownloadSize) }
func (p DownloadPolicy) connectTimeout() time.Duration {
	return orDefault(p.ConnectTimeout, DefaultConnectTimeout)
}
func (p DownloadPolicy) stallTimeout() time.Duration {
	return orDefault(p.StallTimeout, DefaultStallTimeout)
}
func (p DownloadPolicy) timeout() time.Duration { return orDefault(p.Timeout, DefaultDownloadTimeout) }

func orDefault[T int64 | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

// client is an HTTP client for one download. Its dialer checks every
// address it connects to (the first, each redirect's, a proxy's), after
// DNS resolution (dialContext): a name that resolves, or later re-resolves
// (DNS rebinding), to a refused address is refused as well, which no check
// of the URL's host name could promise. With HTTP(S)_PROXY set it is the
// proxy that is dialled and checked (one on a private address must be
// allowed); the proxy decides what it reaches.
func (p DownloadPolicy) client() *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			DialContext:         p.dialContext,
			TLSHandshakeTimeout: p.connectTimeout(),
			// No ResponseHeaderTimeout: the transfer's stall watchdog,
			// started before the request, covers the wait for headers.
			DisableKeepAlives: true, // one transfer per client: nothing to pool
		},
		CheckRedirect: checkRedirect,
	}
}

// checkRedirect follows at most maxRedirects redirects, to http and https
// only (the dialer then checks where each one leads).
func checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= maxRedirects {
		return fmt.Errorf("stopped after %d redirects", maxRedirects)
	}
	if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
		return &addressRefusedError{msg: fmt.Sprintf("redirect to %q refused: only http and https are followed", req.URL.Redacted())}
	}
	return nil
}

// Why an attempt was cut short, when it was not the caller's context.
var (
	errStalled = errors.New("stalled")
	errTimeout = errors.New("overall timeout")
)

// transfer is one GET in flight with its stall watchdog and overall
// timeout; stop releases both and the response.
type transfer struct {
	url    string
	resp   *http.Response
	ctx    context.Context
	policy DownloadPolicy
	stall  *time.Timer
	cancel context.CancelCauseFunc
}

// startTransfer sends the GET (with a Range from offset when resuming).
func startTransfer(ctx context.Context, policy DownloadPolicy, client *http.Client, rawURL string, offset int64) (*transfer, error) {
	reqCtx, cancel := context.WithCancelCause(ctx)
	reqCtx, cancelTimeout := context.WithTimeoutCause(reqCtx, policy.timeout(), errTimeout)
	d := &transfer{url: rawURL, ctx: reqCtx, policy: policy, cancel: func(cause error) { cancel(cause); cancelTimeout() }}
	d.stall = time.AfterFunc(policy.stallTimeout(), func() { cancel(errStalled) })
	req, err := http.NewRequestWithContext(reqCtx, http.MethodGet, rawURL, nil)
	if err != nil {
		d.stop()
		return nil, fmt.Errorf("url %q: %w", rawURL, err)
	}
	if offset > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(offset, 10)+"-")
	}
	resp, err := client.Do(req)
	if err != nil {
		err = d.why(err)
		d.stop()
		return nil, fmt.Errorf("GET %s: %w", rawURL, err)
	}
	d.resp = resp
	d.stall.Reset(policy.stallTimeout())
	return d, nil
}

// body is the response body; each read that brings bytes puts the stall
// watchdog back to its full time.
func (d *transfer) body() io.Reader {
	return readerFunc(func(p []byte) (int, error) {
		n, err := d.resp.Body.Read(p)
		if n > 0 {
			d.stall.Reset(d.policy.stallTimeout())
		}
		return n, err
	})
}

// why replaces the "context canceled" of an attempt the watchdog or the
// overall timeout cut with what happened: an error that is retried (it
// wraps neither context.Canceled, which means "the job was stopped", nor a
// permanent error). The caller's own cancellation stays as it is.
func (d *transfer) why(err error) error {
	if err == nil || d.ctx.Err() == nil {
		return err
	}
	switch cause := context.Cause(d.ctx); {
	case errors.Is(cause, errStalled):
		return fmt.Errorf("no data from the server for %s: %w; the next attempt resumes", d.policy.stallTimeout(), errStalled)
	case errors.Is(cause, errTimeout):
		return fmt.Errorf("the attempt took over %s: %w; the next attempt resumes", d.policy.timeout(), errTimeout)
	}
	return err
}

func (d *transfer) stop() {
	d.stall.Stop()
	if d.resp != nil {
		d.resp.Body.Close()
	}
	d.cancel(nil)
}

type readerFunc func(p []byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }
