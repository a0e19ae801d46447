package imagefile

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
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
var testPolicy = DownloadPolicy{AllowLoopback: true}

func TestCheckDialAddress(t *testing.T) {
	none, local := DownloadPolicy{}, DownloadPolicy{AllowLoopback: true, AllowLinkLocal: true}
	loopbackOnly := DownloadPolicy{AllowLoopback: true}
	tests := []struct {
		address string
		policy  DownloadPolicy
		wantErr string // "" allowed
	}{
		{"169.254.169.254:80", none, "a link-local address"},
		{"169.254.169.254:80", loopbackOnly, "a link-local address"},
		{"169.254.169.254:80", local, ""},
		{"[fe80::1%eth0]:80", none, "a link-local address"},
		{"[64:ff9b::a9fe:a9fe]:80", none, "a link-local address"}, // 169.254.169.254 through NAT64
		{"127.0.0.1:8080", none, "a loopback address"},
		{"127.3.4.5:8080", none, "a loopback address"},
		{"[::1]:80", none, "a loopback address"},
		{"[::ffff:127.0.0.1]:80", none, "a loopback address"},
		{"0.0.0.0:80", none, "a loopback address"},
		{"[::]:80", none, "a loopback address"},
		{"127.0.0.1:8080", loopbackOnly, ""},
		{"10.1.2.3:80", none, ""},
		{"192.168.1.10:443", none, ""},
		{"93.184.216.34:443", none, ""},
		{"[2001:db8::1]:443", none, ""},
	}
	for _, tc := range tests {
		t.Run(tc.address, func(t *testing.T) {
			err := tc.policy.checkDialAddress(tc.address)
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrAddressRefused)
			assert.ErrorContains(t, err, "connecting to "+tc.address+" refused: "+tc.wantErr)
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
		{name: "metadata endpoint", url: "http://169.254.169.254/latest/meta-data/", policy: testPolicy,
			wantErr: "connecting to 169.254.169.254:80 refused: a link-local address", wantIs: ErrAddressRefused},
		{name: "redirect to the metadata endpoint", url: srv.URL + "/to?u=http://169.254.169.254/latest/", policy: testPolicy,
			wantErr: "connecting to 169.254.169.254:80 refused", wantIs: ErrAddressRefused},
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
		{name: "stalled after 1 MiB", policy: DownloadPolicy{AllowLoopback: true, StallTimeout: 300 * time.Millisecond},
			wantErr: "no data from the server for 300ms", wantIs: errStalled},
		{name: "slow past the overall timeout", trickle: true,
			policy:  DownloadPolicy{AllowLoopback: true, StallTimeout: time.Second, Timeout: 500 * time.Millisecond},
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
