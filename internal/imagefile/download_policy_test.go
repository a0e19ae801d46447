package imagefile

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testPolicy reaches httptest servers, which listen on loopback.
var testPolicy = DownloadPolicy{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}

// The decision for each class of address, at the dialer's Control (the
// resolved address, and the host name dialled). Nothing is dialled.
func TestCheckDialAddress(t *testing.T) {
	cluster := DownloadPolicy{AllowedBy: "the setting allowed-networks", Refused: []RefusedRange{
		{netip.MustParsePrefix("203.0.113.7/32"), "an address of the node node-2"},
		{netip.MustParsePrefix("10.244.1.0/24"), "a Pod network address of the cluster"},
		{netip.MustParsePrefix("198.51.100.0/24"), "a Service address of the cluster"},
	}}
	allowCIDR := cluster
	allowCIDR.Allowed = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("203.0.113.7/32")}
	allowHost := cluster
	allowHost.AllowedHosts = []string{"Images.Example.com."}
	tests := []struct {
		name          string
		host, address string // host "": the address's IP was dialled
		policy        DownloadPolicy
		wantErr       string // "" allowed
	}{
		{"loopback", "", "127.0.0.1:8080", cluster, classLoopback},
		{"loopback, all of 127/8", "", "127.3.4.5:8080", cluster, classLoopback},
		{"this network", "", "0.0.0.0:80", cluster, classLoopback},
		{"IPv6 loopback", "", "[::1]:80", cluster, classLoopback},
		{"IPv6 unspecified", "", "[::]:80", cluster, classLoopback},
		{"IPv4 loopback mapped into IPv6", "", "[::ffff:127.0.0.1]:80", cluster, classLoopback},
		{"metadata endpoint", "", "169.254.169.254:80", cluster, classLinkLocal},
		{"IPv6 link-local with a zone", "", "[fe80::1%eth0]:80", cluster, classLinkLocal},
		{"metadata endpoint through NAT64", "", "[64:ff9b::a9fe:a9fe]:80", cluster, classLinkLocal},
		{"RFC 1918 10/8", "", "10.0.0.1:80", cluster, classPrivate},
		{"RFC 1918 172.16/12", "", "172.16.5.5:80", cluster, classPrivate},
		{"RFC 1918 192.168/16", "", "192.168.1.1:443", cluster, classPrivate},
		{"private, mapped into IPv6", "", "[::ffff:10.0.0.1]:80", cluster, classPrivate},
		{"shared, Alibaba's metadata endpoint", "", "100.100.100.200:80", cluster, classShared},
		{"unique-local, AWS's IPv6 metadata endpoint", "", "[fd00:ec2::254]:80", cluster, classUniqueLocal},
		{"multicast", "", "239.1.2.3:80", cluster, classMulticast},
		{"a node's address", "", "203.0.113.7:10250", cluster, "an address of the node node-2"},
		{"a Pod network address", "", "10.244.1.9:80", cluster, "a Pod network address of the cluster"},
		{"a Service address", "", "198.51.100.10:443", cluster, "a Service address of the cluster"},
		{"a name that resolves to a private address", "images.internal", "10.1.2.3:80", cluster, classPrivate},
		{"public", "", "93.184.216.34:443", cluster, ""},
		{"public IPv6", "", "[2001:4860::8888]:443", cluster, ""},
		{"public, named", "example.com", "93.184.216.34:443", cluster, ""},
		{"no policy refuses defaults", "", "10.0.0.1:80", DownloadPolicy{}, classPrivate},
		{"the allowlist admits a private address", "", "10.0.3.4:80", allowCIDR, ""},
		{"the allowlist admits a node's address", "", "203.0.113.7:80", allowCIDR, ""},
		{"the allowlist admits through NAT64", "", "[64:ff9b::a00:304]:80", allowCIDR, ""},
		{"outside the allowlist", "", "10.1.0.1:80", allowCIDR, classPrivate},
		{"an allowed host reaches what it resolves to", "images.example.com", "10.9.9.9:80", allowHost, ""},
		{"an allowed host, another case, a final dot", "IMAGES.example.COM.", "169.254.169.254:80", allowHost, ""},
		{"another host is not allowed", "evil.example.com", "10.9.9.9:80", allowHost, classPrivate},
		{"an allowed host's address dialled by IP", "", "10.9.9.9:80", allowHost, classPrivate},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			host := tc.host
			if host == "" {
				host, _, _ = net.SplitHostPort(tc.address)
			}
			err := tc.policy.checkDialAddress(host, tc.address)
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrAddressRefused)
			var refused *addressRefusedError
			require.ErrorAs(t, err, &refused)
			of := ""
			if tc.host != "" {
				of = " (" + tc.host + ")"
			}
			allowedBy := cmp.Or(tc.policy.AllowedBy, "the download policy's allowlist")
			assert.EqualError(t, err, "connecting to "+tc.address+of+" refused: "+tc.wantErr+
				"; downloads reach it only when "+allowedBy+" admits its address or host name")
		})
	}
}

// imageHandler serves data at /image and redirects /to?u=… to u.
func imageHandler(data []byte) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/image", func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "image", time.Time{}, bytes.NewReader(data))
	})
	mux.HandleFunc("/to", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.Query().Get("u"), http.StatusFound)
	})
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/loop", http.StatusFound)
	})
	return mux
}

// Where a download may go: loopback and link-local only when allowed,
// http and https only, redirects re-checked at each hop by the dialer.
func TestDownloadRefusesAddresses(t *testing.T) {
	data := rawImage(t)
	srv := httptest.NewServer(imageHandler(data))
	t.Cleanup(srv.Close)
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	require.NoError(t, err)
	byName, byNameOnly := "http://LocalHost:"+port, DownloadPolicy{AllowedHosts: []string{"localhost"}}
	tests := []struct {
		name    string
		url     string
		policy  DownloadPolicy
		wantErr string
		wantIs  error // nil: any error that is not a refusal
	}{
		{name: "loopback allowed", url: srv.URL + "/image", policy: testPolicy},
		{name: "loopback refused by default", url: srv.URL + "/image", policy: DownloadPolicy{},
			wantErr: "refused: a loopback address", wantIs: ErrAddressRefused},
		{name: "loopback allowed by host name", url: byName + "/image", policy: byNameOnly},
		{name: "metadata endpoint", url: "http://169.254.169.254/latest/meta-data/", policy: testPolicy,
			wantErr: "connecting to 169.254.169.254:80 refused: a link-local address", wantIs: ErrAddressRefused},
		{name: "redirect to the metadata endpoint", url: srv.URL + "/to?u=http://169.254.169.254/latest/", policy: testPolicy,
			wantErr: "connecting to 169.254.169.254:80 refused", wantIs: ErrAddressRefused},
		{name: "redirect to a private address", url: srv.URL + "/to?u=http://10.0.0.1:8080/image", policy: testPolicy,
			wantErr: "connecting to 10.0.0.1:8080 refused: a private address", wantIs: ErrAddressRefused},
		{name: "redirect to another loopback address than allowed", url: srv.URL + "/to?u=http://127.0.0.2/image",
			policy:  DownloadPolicy{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}},
			wantErr: "connecting to 127.0.0.2:80 refused: a loopback address", wantIs: ErrAddressRefused},
		{name: "redirect from an allowed host to a refused address", url: byName + "/to?u=http://169.254.169.254/latest/",
			policy: byNameOnly, wantErr: "connecting to 169.254.169.254:80 refused: a link-local address", wantIs: ErrAddressRefused},
		{name: "redirect to a file", url: srv.URL + "/to?u=file:///etc/passwd", policy: testPolicy,
			wantErr: `redirect to "file:///etc/passwd" refused: only http and https are followed`, wantIs: ErrAddressRefused},
		{name: "redirect followed", url: srv.URL + "/to?u=/image", policy: testPolicy},
		{name: "redirect loop", url: srv.URL + "/loop", policy: testPolicy, wantErr: "stopped after 5 redirects"},
		{name: "file URL", url: "file:///etc/passwd", policy: testPolicy,
			wantErr: `scheme "file" refused; only http and https are downloaded`, wantIs: ErrAddressRefused},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			part := filepath.Join(t.TempDir(), "part")
			n, err := Download(context.Background(), tc.policy, tc.url, part, nil)
			if tc.wantErr == "" {
				require.NoError(t, err)
				assert.Equal(t, int64(len(data)), n)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
			if tc.wantIs != nil {
				require.ErrorIs(t, err, tc.wantIs)
			} else {
				assert.NotErrorIs(t, err, ErrAddressRefused)
			}
			assert.NotErrorIs(t, err, context.Canceled)
		})
	}
}

// DNS rebinding: a name whose first answer is an allowed address and whose
// next is a private one. The redirect to the same host dials again and
// resolves again: that connection is refused, although the first went
// through. A check of the name before the request could not tell.
func TestDownloadRefusesADNSAnswerThatChanges(t *testing.T) {
	data := rawImage(t)
	srv := httptest.NewServer(imageHandler(data))
	t.Cleanup(srv.Close)
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	require.NoError(t, err)
	tests := []struct {
		name    string
		answers []string // the name's address at the first lookup, the second, …
		url     string
		wantErr string // "" the download succeeds
	}{
		{name: "the same answer twice", answers: []string{"127.0.0.1"}, url: "/to?u=/image"},
		{name: "a private address at the redirect", answers: []string{"127.0.0.1", "10.0.0.1"}, url: "/to?u=/image",
			wantErr: "connecting to 10.0.0.1:" + port + " (img.test) refused: a private address"},
		{name: "the metadata endpoint at the redirect", answers: []string{"127.0.0.1", "169.254.169.254"}, url: "/to?u=/image",
			wantErr: "connecting to 169.254.169.254:" + port + " (img.test) refused: a link-local address"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dns := &fakeDNS{name: "img.test."}
			for _, a := range tc.answers {
				dns.answers = append(dns.answers, netip.MustParseAddr(a))
			}
			policy := DownloadPolicy{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, resolver: dns.resolver()}
			n, err := Download(context.Background(), policy, "http://img.test:"+port+tc.url, filepath.Join(t.TempDir(), "part"), nil)
			assert.Equal(t, 2, dns.queries(), "resolved at each dial: the first request's and the redirect's")
			if tc.wantErr == "" {
				require.NoError(t, err)
				assert.Equal(t, int64(len(data)), n)
				return
			}
			require.ErrorIs(t, err, ErrAddressRefused)
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

// The size cap: a source that says it is too large is refused before its
// body is read; one that does not say is stopped at the cap.
func TestDownloadSizeCap(t *testing.T) {
	data := rawImage(t)
	tests := []struct {
		name    string
		chunked bool // no Content-Length
		partial int  // bytes already in the part file
		wantErr string
	}{
		{name: "Content-Length over the cap", wantErr: "the source is 8Mi (8388608 bytes), more than the download size cap of 1Mi"},
		{name: "chunked, passes the cap", chunked: true, wantErr: "the source sent more than the download size cap of 1Mi; stopped there"},
		{name: "a part file already over the cap", partial: 2 << 20, wantErr: "the source is 2Mi"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var sent atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if !tc.chunked {
					w.Header().Set("Content-Length", strconv.Itoa(len(data)))
				}
				for off := 0; off < len(data); off += 64 << 10 {
					n, err := w.Write(data[off : off+64<<10])
					sent.Add(int64(n))
					if err != nil {
						return
					}
					w.(http.Flusher).Flush()
				}
			}))
			t.Cleanup(srv.Close)
			part := filepath.Join(t.TempDir(), "part")
			if tc.partial > 0 {
				require.NoError(t, os.WriteFile(part, data[:tc.partial], 0o600))
			}
			policy := testPolicy
			policy.MaxSize = 1 << 20
			_, err := Download(context.Background(), policy, srv.URL+"/image", part, nil)
			require.ErrorIs(t, err, ErrLimitExceeded)
			assert.ErrorContains(t, err, tc.wantErr)
			var le *LimitError
			require.ErrorAs(t, err, &le)
			assert.Equal(t, LimitDownloadSize, le.Limit)
			if st, statErr := os.Stat(part); statErr == nil && tc.partial == 0 {
				assert.LessOrEqual(t, st.Size(), policy.MaxSize, "no more than the cap written")
			}
		})
	}
}

// A server that stops sending fails the attempt after the stall timeout
// with an error that is retried (not "stopped", not permanent); the next
// attempt resumes where it stopped. The overall timeout likewise.
func TestDownloadStallAndTimeout(t *testing.T) {
	data := rawImage(t)
	tests := []struct {
		name    string
		policy  DownloadPolicy
		trickle bool // send 4 KiB every 20 ms for ever, instead of stalling
		wantErr string
		wantIs  error
	}{
		{name: "stalled after 1 MiB", policy: DownloadPolicy{Allowed: testPolicy.Allowed, StallTimeout: 300 * time.Millisecond},
			wantErr: "no data from the server for 300ms", wantIs: errStalled},
		{name: "slow past the overall timeout", trickle: true,
			policy:  DownloadPolicy{Allowed: testPolicy.Allowed, StallTimeout: time.Second, Timeout: 500 * time.Millisecond},
			wantErr: "the attempt took over 500ms", wantIs: errTimeout},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var requests atomic.Int32
			release := make(chan struct{})
			t.Cleanup(func() { close(release) })
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if requests.Add(1) > 1 { // the retry: a healthy server
					http.ServeContent(w, r, "image", time.Time{}, bytes.NewReader(data))
					return
				}
				w.Header().Set("Content-Length", strconv.Itoa(len(data)))
				if !tc.trickle {
					_, _ = w.Write(data[:1<<20])
					w.(http.Flusher).Flush()
					select {
					case <-release:
					case <-r.Context().Done():
					}
					return
				}
				for off := 0; ; off += 4096 {
					if _, err := w.Write(data[off : off+4096]); err != nil {
						return
					}
					w.(http.Flusher).Flush()
					time.Sleep(20 * time.Millisecond)
				}
			}))
			t.Cleanup(srv.Close)
			part := filepath.Join(t.TempDir(), "part")
			start := time.Now()
			_, err := Download(context.Background(), tc.policy, srv.URL+"/image", part, nil)
			require.ErrorIs(t, err, tc.wantIs)
			assert.ErrorContains(t, err, tc.wantErr)
			assert.Less(t, time.Since(start), 5*time.Second)
			assert.False(t, errors.Is(err, context.Canceled) || errors.Is(err, ErrAddressRefused) || errors.Is(err, ErrLimitExceeded),
				"retried: neither a stopped job nor a permanent failure")
			got, err := os.ReadFile(part)
			require.NoError(t, err)
			require.NotEmpty(t, got, "the prefix is kept for the next attempt")
			assert.True(t, bytes.Equal(data[:len(got)], got))

			n, err := Download(context.Background(), tc.policy, srv.URL+"/image", part, nil)
			require.NoError(t, err, "the next attempt resumes")
			assert.Equal(t, int64(len(data)), n)
			got, err = os.ReadFile(part)
			require.NoError(t, err)
			assert.True(t, bytes.Equal(data, got))
		})
	}
}
