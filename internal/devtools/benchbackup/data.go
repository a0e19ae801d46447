package benchbackup

import (
	"bufio"
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
)

const block = 1 << 20 // the unit of change, the target's default chunk size

// writeRandom writes size bytes of incompressible random data to path.
func writeRandom(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, block)
	r := newRand()
	if _, err := io.CopyN(w, r, size); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Close()
}

// newRand is a fast random stream (ChaCha8) with a fresh seed per run.
func newRand() *rand.ChaCha8 {
	var seed [32]byte
	_, _ = crand.Read(seed[:])
	return rand.NewChaCha8(seed)
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// volumeSHA256 reads a whole NBD export with nbdcopy and hashes it.
func (e *env) volumeSHA256(ctx context.Context, uri string) (string, error) {
	cmd := exec.CommandContext(ctx, "nbdcopy", uri, "-")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	var stderr limitedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return "", err
	}
	h := sha256.New()
	_, copyErr := io.Copy(h, stdout)
	if err := cmd.Wait(); err != nil {
		return "", fmt.Errorf("nbdcopy %s -: %w: %s", uri, err, stderr.String())
	}
	if copyErr != nil {
		return "", copyErr
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// timedNBDCopy times `nbdcopy --flush src dst`, the size of src being the
// bytes moved, after an untimed sync.
func (e *env) timedNBDCopy(ctx context.Context, src, dst string) (phase, error) {
	syscall.Sync()
	p, err := e.timed(func() error { return nbdcopy(ctx, "--flush", src, dst) })
	p.bytes, p.objects = int64(e.cfg.sizeMiB)<<20, -1
	return p, err
}

func nbdcopy(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "nbdcopy", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("nbdcopy %v: %w: %s", args, err, out)
	}
	return nil
}

// changeBlocks rewrites changePercent of the volume's 1 MiB blocks, chosen
// at random over the whole volume, with new random data: in the data file
// (which then holds the volume's expected content) and over NBD. Only
// those blocks are written: a sparse file holding just them is copied with
// --target-is-zero, which makes nbdcopy skip its holes. It returns how
// many blocks changed.
func (e *env) changeBlocks(ctx context.Context, data, uri string, size int64) (int, error) {
	blocks := int(size / block)
	n := max(1, blocks*e.cfg.changePercent/100)
	src := newRand()
	picked := rand.New(src).Perm(blocks)[:n]
	slices.Sort(picked)

	sparse := filepath.Join(e.work, "changes.img")
	df, err := os.OpenFile(data, os.O_WRONLY, 0)
	if err != nil {
		return 0, err
	}
	defer df.Close()
	sf, err := os.Create(sparse)
	if err != nil {
		return 0, err
	}
	defer os.Remove(sparse)
	defer sf.Close()
	if err := sf.Truncate(size); err != nil {
		return 0, err
	}
	buf := make([]byte, block)
	for _, b := range picked {
		_, _ = io.ReadFull(src, buf)
		off := int64(b) * block
		if _, err := sf.WriteAt(buf, off); err != nil {
			return 0, err
		}
		if _, err := df.WriteAt(buf, off); err != nil {
			return 0, err
		}
	}
	if err := df.Close(); err != nil {
		return 0, err
	}
	if err := sf.Close(); err != nil {
		return 0, err
	}
	e.log.WithField("blocks", n).Info("Rewriting blocks over NBD")
	return n, nbdcopy(ctx, "--target-is-zero", "--flush", sparse, uri)
}

// limitedBuffer keeps the first 4 KiB written to it (a command's stderr).
type limitedBuffer struct{ b []byte }

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := 4096 - len(l.b); room > 0 {
		l.b = append(l.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (l *limitedBuffer) String() string { return string(l.b) }

func removeAll(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	return nil
}
