package imagefile

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// Resource limits of qemu-img on an image from outside. Go cannot set a
// child's rlimits itself, so qemu-img runs under prlimit (util-linux),
// which sets them and execs it (same process, so the context's kill reaches
// qemu-img). glibc reserves 64 MiB of address space per malloc arena and
// thread, so MALLOC_ARENA_MAX=2 keeps the address-space cap about memory
// (1 GiB failed now and then without it, never with it).
const (
	qemuImgAddressSpace = 2 << 30
	qemuImgInfoCPU      = 30 // seconds: info reads a header and some tables
	// qemuImgConvertCPU: a minute plus one second per 16 MiB of virtual
	// size, well above what zlib decompression of a full image costs;
	// the context bounds the wall-clock time.
	qemuImgConvertCPU   = 60
	qemuImgBytesPerCPUs = 16 << 20
	// qemuImgMaxOutput bounds what is kept of qemu-img's stdout and
	// stderr: JSON of an image with thousands of snapshots is still
	// small, and a message is one line.
	qemuImgMaxOutput = 1 << 20
	qemuImgWaitDelay = 5 * time.Second
)

// qemuLimits are one qemu-img run's rlimits; a zero fileSize sets none.
type qemuLimits struct {
	cpuSeconds int64
	fileSize   int64
}

// runQemuImg runs qemu-img with args under limits and ctx, and returns its
// stdout (at most qemuImgMaxOutput bytes).
func runQemuImg(ctx context.Context, limits qemuLimits, args ...string) ([]byte, error) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		return nil, fmt.Errorf("prlimit (util-linux) is not installed: qemu-img only runs on an image under resource limits: %w", err)
	}
	flags := []string{
		"--as=" + strconv.FormatInt(qemuImgAddressSpace, 10),
		"--cpu=" + strconv.FormatInt(limits.cpuSeconds, 10),
		"--core=0", // a crash on a hostile image leaves no core file of it on the disk
	}
	if limits.fileSize > 0 {
		flags = append(flags, "--fsize="+strconv.FormatInt(limits.fileSize, 10))
	}
	cmd := exec.CommandContext(ctx, prlimit, append(append(flags, "--", "qemu-img"), args...)...)
	cmd.Env = append(os.Environ(), "MALLOC_ARENA_MAX=2")
	cmd.WaitDelay = qemuImgWaitDelay
	stdout, stderr := &boundedBuffer{max: qemuImgMaxOutput}, &boundedBuffer{max: qemuImgMaxOutput}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("qemu-img %s: %w: %s", args[0], err, bytes.TrimSpace(stderr.buf.Bytes()))
	}
	if stdout.dropped {
		return nil, fmt.Errorf("qemu-img %s printed more than %d bytes", args[0], qemuImgMaxOutput)
	}
	return stdout.buf.Bytes(), nil
}

// boundedBuffer keeps the first max bytes written to it and drops the rest
// (still reporting them written, so the child never blocks on a pipe).
type boundedBuffer struct {
	buf     bytes.Buffer
	max     int
	dropped bool
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	keep := p
	if room := b.max - b.buf.Len(); len(keep) > room {
		keep, b.dropped = keep[:max(room, 0)], true
	}
	b.buf.Write(keep)
	return len(p), nil
}

// qemuImgInfo is what Strata reads of `qemu-img info --output=json`.
type qemuImgInfo struct {
	VirtualSize     uint64 `json:"virtual-size"`
	BackingFilename string `json:"backing-filename"`
	FormatSpecific  struct {
		Data struct {
			DataFile string `json:"data-file"`
		} `json:"data"`
	} `json:"format-specific"`
}

// convertQCOW2 writes a qcow2 image as sparse raw (qemu-img; Debian
// qemu-utils). qemu-img, not a Go reader: it knows every qcow2 feature
// (compression, extended L2). The header is checked first (readQCOW2Header:
// no backing or data file, a virtual size under the cap); qemu-img's own
// view is checked again before it converts, under resource limits.
func convertQCOW2(ctx context.Context, src, dst string, limits Limits) error {
	h, err := readQCOW2Header(src)
	if err != nil {
		return err
	}
	if err := h.check(limits); err != nil {
		return err
	}
	// An absolute path: qemu-img takes a name starting "json:" as options.
	if src, err = filepath.Abs(src); err != nil {
		return err
	}
	if dst, err = filepath.Abs(dst); err != nil {
		return err
	}
	out, err := runQemuImg(ctx, qemuLimits{cpuSeconds: qemuImgInfoCPU}, "info", "-f", "qcow2", "--output=json", src)
	if err != nil {
		return err
	}
	var info qemuImgInfo
	if err := json.Unmarshal(out, &info); err != nil {
		return fmt.Errorf("qemu-img info: %w", err)
	}
	if err := info.check(limits); err != nil {
		return err
	}
	size := int64(max(info.VirtualSize, h.virtualSize))
	_, err = runQemuImg(ctx, qemuLimits{cpuSeconds: qemuImgConvertCPU + size/qemuImgBytesPerCPUs, fileSize: size},
		"convert", "-f", "qcow2", "-O", "raw", "-S", "4k", src, dst)
	return err
}

// check refuses what qemu-img reports and the header check did not see (a
// second opinion: qemu-img knows the format better than any reader here).
func (i *qemuImgInfo) check(limits Limits) error {
	switch {
	case i.BackingFilename != "":
		return notAnImage("the qcow2 image has a backing file (%q); only self-contained images are taken", i.BackingFilename)
	case i.FormatSpecific.Data.DataFile != "":
		return notAnImage("qcow2 image with an external data file (data_file=%q): refused, it would read a file of the host",
			i.FormatSpecific.Data.DataFile)
	}
	return checkVirtualSize("the qcow2 image's virtual size", i.VirtualSize, limits)
}
