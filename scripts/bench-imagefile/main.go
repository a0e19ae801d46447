// Command bench-imagefile is a benchmark (not a test) of internal/imagefile,
// the library the backing image controller fetches and copies images with,
// each figure beside the by-hand baseline measured in the same run:
//
//   - download + convert of a qcow2 image served over HTTP on loopback
//     (imagefile.Download, then imagefile.Prepare: qemu-img convert to sparse
//     raw and the SHA-512 of the raw data) against `curl -o` followed by
//     `qemu-img convert -O raw` and `sha512sum`;
//
//   - disk-to-disk copy of the raw image (imagefile.CopyFile: data extents
//     only, fsync) against `cp --sparse=always` and `sync`;
//
//   - a copy between managers: the raw image fetched over HTTP as an extent
//     stream (imagefile.WriteExtents / FetchExtents, as a peer's API serves
//     it) and its SHA-512 checked, as the controller does, against `curl -o`
//     of the raw file and `sha512sum`.
//
//     go run ./scripts/bench-imagefile [-size-mib 512] [-data-percent 50] [-dir DIR]
//
// The image holds random data in -data-percent of its 1 MiB extents; the
// rest are holes. Needs qemu-img, curl, sha512sum and cp.
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/strata-storage/strata/internal/imagefile"
)

func main() {
	sizeMiB := flag.Int("size-mib", 512, "virtual size of the image")
	dataPct := flag.Int("data-percent", 50, "share of 1 MiB extents holding data")
	dir := flag.String("dir", os.TempDir(), "where the work directory goes (a real disk, not tmpfs)")
	flag.Parse()
	if err := run(*sizeMiB, *dataPct, *dir); err != nil {
		fmt.Fprintln(os.Stderr, "bench-imagefile:", err)
		os.Exit(1)
	}
}

func run(sizeMiB, dataPct int, base string) error {
	work, err := os.MkdirTemp(base, "strata-bench-imagefile-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	raw := filepath.Join(work, "source.raw")
	if err := makeImage(raw, sizeMiB, dataPct); err != nil {
		return err
	}
	qcow := filepath.Join(work, "source.qcow2")
	if err := sh("qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, qcow); err != nil {
		return err
	}
	url, stop, err := serve(work)
	if err != nil {
		return err
	}
	defer stop()
	ctx := context.Background()

	// imagefile: download, then prepare.
	part, final := filepath.Join(work, "lib.part"), filepath.Join(work, "lib.raw")
	libFetch := timed(func() error {
		// The bench's server listens on loopback, which downloads refuse unless allowed.
		policy := imagefile.DownloadPolicy{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
		if _, err := imagefile.Download(ctx, policy, url+"/source.qcow2", part, nil); err != nil {
			return err
		}
		_, err := imagefile.Prepare(ctx, part, final, "", imagefile.Limits{})
		return err
	})
	// By hand: curl, qemu-img convert, sha512sum.
	handFetch := timed(func() error {
		if err := sh("curl", "-sSf", "-o", filepath.Join(work, "hand.qcow2"), url+"/source.qcow2"); err != nil {
			return err
		}
		if err := sh("qemu-img", "convert", "-f", "qcow2", "-O", "raw", filepath.Join(work, "hand.qcow2"), filepath.Join(work, "hand.raw")); err != nil {
			return err
		}
		return sh("sha512sum", filepath.Join(work, "hand.raw"))
	})
	libCopy := timed(func() error { return imagefile.CopyFile(ctx, final, filepath.Join(work, "copy-lib.raw"), nil) })
	handCopy := timed(func() error {
		if err := sh("cp", "--sparse=always", final, filepath.Join(work, "copy-hand.raw")); err != nil {
			return err
		}
		return sh("sync", filepath.Join(work, "copy-hand.raw"))
	})
	libPeer := timed(func() error {
		dst := filepath.Join(work, "peer-lib.raw")
		if err := imagefile.FetchExtents(ctx, nil, url+"/extents/lib.raw", dst, nil); err != nil {
			return err
		}
		_, _, err := imagefile.Checksum(ctx, dst)
		return err
	})
	handPeer := timed(func() error {
		if err := sh("curl", "-sSf", "-o", filepath.Join(work, "peer-hand.raw"), url+"/lib.raw"); err != nil {
			return err
		}
		return sh("sha512sum", filepath.Join(work, "peer-hand.raw"))
	})
	for _, r := range []result{libFetch, handFetch, libCopy, handCopy, libPeer, handPeer} {
		if r.err != nil {
			return r.err
		}
	}
	mib := float64(sizeMiB)
	fmt.Printf("\nimage of %d MiB (%d%% data), qcow2 served over HTTP on loopback\n", sizeMiB, dataPct)
	fmt.Printf("%-44s %10s %10s %7s\n", "", "imagefile", "by hand", "ratio")
	row := func(label string, lib, hand result) {
		l, h := mib/lib.d.Seconds(), mib/hand.d.Seconds()
		fmt.Printf("%-44s %10.0f %10.0f %6.2fx\n", label, l, h, l/h)
	}
	row("download + convert + SHA-512, MiB/s", libFetch, handFetch)
	row("disk-to-disk copy (+ fsync), MiB/s", libCopy, handCopy)
	row("copy from a peer over HTTP + SHA-512, MiB/s", libPeer, handPeer)
	return nil
}

type result struct {
	d   time.Duration
	err error
}

func timed(fn func() error) result {
	start := time.Now()
	err := fn()
	return result{time.Since(start), err}
}

// makeImage writes a sparse raw image with random data in dataPct of its
// 1 MiB extents, spread evenly.
func makeImage(path string, sizeMiB, dataPct int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(int64(sizeMiB) << 20); err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for i := 0; i < sizeMiB; i++ {
		if i*dataPct/100 == (i+1)*dataPct/100 {
			continue
		}
		if _, err := rand.Read(buf); err != nil {
			return err
		}
		if _, err := f.WriteAt(buf, int64(i)<<20); err != nil {
			return err
		}
	}
	return f.Sync()
}

func serve(dir string) (string, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/", http.FileServer(http.Dir(dir)))
	mux.HandleFunc("/extents/{name}", func(w http.ResponseWriter, r *http.Request) {
		_ = imagefile.WriteExtents(r.Context(), w, filepath.Join(dir, filepath.Base(r.PathValue("name"))))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return "http://" + l.Addr().String(), func() { _ = srv.Close() }, nil
}

func sh(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %v: %w: %s", name, args, err, out)
	}
	return nil
}
