package benchbackup

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/internal/backupstore"
)

// logSettle is how long the server is given to write the log lines of
// requests it already answered before the log is read.
const logSettle = 300 * time.Millisecond

func (e *env) requestLog() string { return filepath.Join(e.s3.Dir, "versitygw.log") }

// requestLogMark is where the server's log ends now, once the lines of
// earlier requests are in.
func (e *env) requestLogMark() (int64, error) {
	time.Sleep(logSettle)
	fi, err := os.Stat(e.requestLog())
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// requestsSince counts the requests versitygw logged after from, by kind:
// its request log has one line a request, "time | vgw | status | latency |
// client | METHOD | path | …". A GET of the bucket itself is a LIST.
func (e *env) requestsSince(ctx context.Context, from int64) (map[string]int64, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(logSettle):
	}
	f, err := os.Open(e.requestLog())
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return nil, err
	}
	text, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	// Matched in the whole text, not line by line: versitygw does not write
	// a request's line in one piece, so two requests ending together can
	// interleave ("t | vgw | t | vgw | 204 | 16ms | … DELETE …" and a next
	// line starting "204 | …"). Each request's "status | latency | client |
	// METHOD | path" stays whole, and that is what is counted.
	out := map[string]int64{}
	for _, m := range requestRecord.FindAllStringSubmatch(string(text), -1) {
		method, path := m[1], strings.Trim(m[2], "/")
		if method == "GET" && !strings.Contains(path, "/") {
			method = "LIST"
		}
		out[method]++
	}
	return out, nil
}

// requestRecord is one request in versitygw's log: "status | latency |
// client | METHOD | path", after a "|" or at a line's start.
var requestRecord = regexp.MustCompile(`(?m)(?:^|\|)\s*\d{3}\s*\|\s*[0-9][0-9.µnmhs]*\s*\|[^|]*\|\s*([A-Z]+)\s*\|\s*([^|\s]*)`)

// objects counts the backup target's objects.
func (e *env) objects(ctx context.Context) (int64, error) {
	objs, err := e.store.List(ctx, "")
	return int64(len(objs)), err
}

// rawS3 times PUT and then GET of the volume's bytes (the random data
// file) as pack-sized objects, concurrency at a time, through the same
// S3Store the backups use: the server's and the client's own throughput.
// The PUT phase also checks that the request log saw every request.
func (e *env) rawS3(ctx context.Context, data string, res *results) error {
	f, err := os.Open(data)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	size, ps := fi.Size(), int64(backupstore.DefaultPackSize)
	n := int((size + ps - 1) / ps)
	// Each PUT run writes objects of its own, as a backup's packs are: a
	// run that replaced the last run's objects could have the server's file
	// system reuse the page cache they held, which no backup gets (on these
	// VMs fresh memory costs more to write into; docs/bench-backup.md).
	run := 0
	key := func(i int) string { return fmt.Sprintf("obj-%d-%04d", run, i) }
	span := func(i int) (int64, int64) { off := int64(i) * ps; return off, min(ps, size-off) }

	e.log.WithFields(logrus.Fields{"objects": n, "MiB": ps >> 20, "streams": e.cfg.concurrency}).Info("Baseline: raw S3 PUT")
	if res.put, err = bestOf(e.cfg.runs, func() (phase, error) {
		run++
		return e.timedRequests(ctx, func() error {
			return parallel(n, e.cfg.concurrency, func(i int) error {
				off, l := span(i)
				return e.raw.Put(ctx, key(i), io.NewSectionReader(f, off, l), l)
			})
		})
	}); err != nil {
		return fmt.Errorf("raw PUT: %w", err)
	}
	if got := res.put.requests["PUT"]; got != int64(n) {
		return fmt.Errorf("the S3 server logged %d PUTs for %d objects put: its request log cannot count requests", got, n)
	}
	res.put.bytes, res.put.objects = size, int64(n)

	e.log.Info("Baseline: raw S3 GET")
	if res.get, err = bestOf(e.cfg.runs, func() (phase, error) {
		return e.timedRequests(ctx, func() error {
			return parallel(n, e.cfg.concurrency, func(i int) error {
				_, l := span(i)
				r, err := e.raw.Get(ctx, key(i))
				if err != nil {
					return err
				}
				defer r.Close()
				got, err := io.Copy(io.Discard, r)
				if err == nil && got != l {
					err = fmt.Errorf("object %s: %d bytes, put %d", key(i), got, l)
				}
				return err
			})
		})
	}); err != nil {
		return fmt.Errorf("raw GET: %w", err)
	}
	res.get.bytes, res.get.objects = size, -1
	// Gone again, so the bucket holds only the backups from here on.
	for ; run > 0; run-- {
		if err := parallel(n, e.cfg.concurrency, func(i int) error { return e.raw.Delete(ctx, key(i)) }); err != nil {
			return err
		}
	}
	return nil
}

// parallel runs fn(0..n-1) on workers goroutines and returns the first error.
func parallel(n, workers int, fn func(int) error) error {
	next := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			var first error
			for i := range next {
				if first == nil {
					first = fn(i)
				}
			}
			errs <- first
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
