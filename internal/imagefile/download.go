package imagefile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/strata-storage/strata/types"
)

// Progress is told the bytes done so far and the total (0 when unknown).
type Progress func(done, total int64)

// Download fetches rawURL into the file part and returns its total size,
// within policy's bounds (the address it may reach, its timeouts, its size
// cap). A part file an interrupted download left (a manager killed
// mid-transfer, a stall, the overall timeout) is continued with an HTTP
// Range request when the server honours it, and started over when it does
// not. The file is fsynced before Download returns; it is only ever
// appended to, so a crash leaves a prefix.
func Download(ctx context.Context, policy DownloadPolicy, rawURL, part string, progress Progress) (int64, error) {
	if err := checkScheme(rawURL); err != nil {
		return 0, err
	}
	offset := int64(0)
	if st, err := os.Stat(part); err == nil {
		offset = st.Size()
	}
	maxSize := policy.maxSize()
	if offset > maxSize {
		return 0, downloadTooLarge(rawURL, offset, maxSize)
	}
	client := policy.client()
	defer client.CloseIdleConnections()
	dl, err := startTransfer(ctx, policy, client, rawURL, offset)
	if err != nil {
		return 0, err
	}
	defer dl.stop()
	total, appendTo, complete, err := rangeOf(dl.resp, rawURL, offset)
	switch {
	case err != nil:
		return 0, err
	case complete:
		return offset, syncFile(part)
	case total > maxSize:
		return 0, downloadTooLarge(rawURL, total, maxSize)
	}
	if !appendTo {
		offset = 0
	}
	return dl.save(part, appendTo, offset, total, maxSize, progress)
}

// rangeOf reads how the server answered a GET from offset: the source's
// total size (0: unknown), whether the body continues the part file, or
// that the part file is already complete.
func rangeOf(resp *http.Response, rawURL string, offset int64) (total int64, appendTo, complete bool, err error) {
	switch {
	case resp.StatusCode == http.StatusPartialContent && offset > 0:
		start, size, ok := parseContentRange(resp.Header.Get("Content-Range"))
		if !ok || start != offset {
			return 0, false, false, fmt.Errorf("GET %s: the server answered the range from %d with %q", rawURL, offset, resp.Header.Get("Content-Range"))
		}
		return size, true, false, nil
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable && offset > 0:
		// Nothing after offset: complete if the server's size is offset.
		if _, size, ok := parseContentRange(resp.Header.Get("Content-Range")); ok && size == offset {
			return size, false, true, nil
		}
		return 0, false, false, fmt.Errorf("GET %s: the partial file has %d bytes, more than the server has (%s); delete it to start over",
			rawURL, offset, resp.Header.Get("Content-Range"))
	case resp.StatusCode == http.StatusOK:
		return max(resp.ContentLength, 0), false, false, nil // no ranges: from the start
	}
	return 0, false, false, fmt.Errorf("GET %s: %s", rawURL, resp.Status)
}

// save writes the response body into part (appended after offset, or from
// the start) and checks it got the total.
func (d *transfer) save(part string, appendTo bool, offset, total, maxSize int64, progress Progress) (int64, error) {
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if appendTo {
		flags = os.O_WRONLY | os.O_APPEND
	}
	f, err := os.OpenFile(part, flags, 0o600)
	if err != nil {
		return 0, err
	}
	w := &progressWriter{w: f, done: offset, total: total, progress: progress}
	body := &cappedReader{r: d.body(), max: maxSize - offset, tooLarge: func() error {
		return downloadTooLarge(d.url, -1, maxSize)
	}}
	_, copyErr := io.CopyBuffer(w, body, make([]byte, 256<<10))
	syncErr := f.Sync()
	closeErr := f.Close()
	if err := errors.Join(d.why(copyErr), syncErr, closeErr); err != nil {
		return 0, fmt.Errorf("GET %s: after %d bytes: %w", d.url, w.done, err)
	}
	if total > 0 && w.done != total {
		return 0, fmt.Errorf("GET %s: got %d of %d bytes", d.url, w.done, total)
	}
	return w.done, nil
}

// downloadTooLarge refuses a source of size bytes (-1: it sent more than
// the cap without saying its size first).
func downloadTooLarge(rawURL string, size, maxSize int64) error {
	if size < 0 {
		return limitExceeded(LimitDownloadSize, maxSize, "GET %s: the source sent more than the download size cap of %s; stopped there",
			rawURL, types.ApproxBytes(maxSize))
	}
	return limitExceeded(LimitDownloadSize, maxSize, "GET %s: the source is %s (%d bytes), more than the download size cap of %s",
		rawURL, types.ApproxBytes(size), size, types.ApproxBytes(maxSize))
}

// checkScheme takes http and https URLs only: anything else (file://,
// gopher://) is no download.
func checkScheme(rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("url %q: %w", rawURL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return &addressRefusedError{msg: fmt.Sprintf("url %q: scheme %q refused; only http and https are downloaded", rawURL, u.Scheme)}
	}
	return nil
}

// parseContentRange reads "bytes START-END/SIZE" or "bytes */SIZE".
func parseContentRange(v string) (start, size int64, ok bool) {
	rest, found := strings.CutPrefix(v, "bytes ")
	if !found {
		return 0, 0, false
	}
	rng, sizeText, found := strings.Cut(rest, "/")
	if !found {
		return 0, 0, false
	}
	size, err := strconv.ParseInt(sizeText, 10, 64)
	if err != nil {
		return 0, 0, false
	}
	if rng == "*" {
		return 0, size, true
	}
	startText, _, found := strings.Cut(rng, "-")
	if !found {
		return 0, 0, false
	}
	start, err = strconv.ParseInt(startText, 10, 64)
	return start, size, err == nil
}

type progressWriter struct {
	w           io.Writer
	done, total int64
	progress    Progress
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.done += int64(n)
	if p.progress != nil {
		p.progress(p.done, p.total)
	}
	return n, err
}

func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	return errors.Join(f.Sync(), f.Close())
}
