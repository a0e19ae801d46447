package imagefile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
)

// Progress is told the bytes done so far and the total (0 when unknown).
type Progress func(done, total int64)

// Download fetches url into the file part and returns its total size. A
// part file an interrupted download left (a manager killed mid-transfer) is
// continued with an HTTP Range request when the server honours it, and
// started over when it does not. The file is fsynced before Download
// returns; it is only ever appended to, so a crash leaves a prefix.
func Download(ctx context.Context, client *http.Client, url, part string, progress Progress) (int64, error) {
	if client == nil {
		client = http.DefaultClient
	}
	offset := int64(0)
	if st, err := os.Stat(part); err == nil {
		offset = st.Size()
	}
	resp, err := get(ctx, client, url, offset)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()

	total, appendTo := int64(0), false
	switch {
	case resp.StatusCode == http.StatusPartialContent && offset > 0:
		start, size, ok := parseContentRange(resp.Header.Get("Content-Range"))
		if !ok || start != offset {
			return 0, fmt.Errorf("GET %s: the server answered the range from %d with %q", url, offset, resp.Header.Get("Content-Range"))
		}
		total, appendTo = size, true
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable && offset > 0:
		// Nothing after offset: complete if the server's size is offset.
		if _, size, ok := parseContentRange(resp.Header.Get("Content-Range")); ok && size == offset {
			return offset, syncFile(part)
		}
		return 0, fmt.Errorf("GET %s: the partial file has %d bytes, more than the server has (%s); delete it to start over",
			url, offset, resp.Header.Get("Content-Range"))
	case resp.StatusCode == http.StatusOK:
		offset, total = 0, max(resp.ContentLength, 0) // no ranges: from the start
	default:
		return 0, fmt.Errorf("GET %s: %s", url, resp.Status)
	}

	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if appendTo {
		flags = os.O_WRONLY | os.O_APPEND
	}
	f, err := os.OpenFile(part, flags, 0o600)
	if err != nil {
		return 0, err
	}
	w := &progressWriter{w: f, done: offset, total: total, progress: progress}
	_, copyErr := io.Copy(w, resp.Body)
	syncErr := f.Sync()
	closeErr := f.Close()
	if err := errors.Join(copyErr, syncErr, closeErr); err != nil {
		return 0, fmt.Errorf("GET %s: after %d bytes: %w", url, w.done, err)
	}
	if total > 0 && w.done != total {
		return 0, fmt.Errorf("GET %s: got %d of %d bytes", url, w.done, total)
	}
	return w.done, nil
}

func get(ctx context.Context, client *http.Client, url string, offset int64) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("url %q: %w", url, err)
	}
	if offset > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(offset, 10)+"-")
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return resp, nil
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
