package imagefile

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"os"
)

// The extent stream moves a sparse image between managers: HTTP has no way
// to say "this range is a hole", and sending a 10 GiB image that holds
// 300 MiB of data as 10 GiB of bytes (or as one Range request per extent)
// would waste the network. The stream is
//
//	magic "STRXT1\n\x00", u64 file size,
//	then per data extent: u64 offset, u64 length, length bytes,
//	then the end mark: u64 size, u64 0.
//
// All integers are big-endian. The end mark tells a complete stream from
// one a dying peer cut short.
var extentMagic = [8]byte{'S', 'T', 'R', 'X', 'T', '1', '\n', 0}

// maxExtentFrame bounds one frame's length, so a corrupt header cannot make
// the reader trust a huge length; big extents are sent as several frames.
const maxExtentFrame = 64 << 20

// WriteExtents writes the file at path as an extent stream: only its data
// extents are read (SEEK_DATA/SEEK_HOLE).
func WriteExtents(ctx context.Context, w io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	bw := bufio.NewWriterSize(w, 1<<20)
	hdr := make([]byte, 16)
	copy(hdr, extentMagic[:])
	if _, err := bw.Write(hdr[:8]); err != nil {
		return err
	}
	if err := writeU64s(bw, hdr, uint64(size)); err != nil {
		return err
	}
	err = forEachExtent(f, size, func(start, end int64) error {
		for pos := start; pos < end; {
			if err := ctx.Err(); err != nil {
				return err
			}
			n := min(end-pos, maxExtentFrame)
			if err := writeU64s(bw, hdr, uint64(pos), uint64(n)); err != nil {
				return err
			}
			if _, err := io.Copy(bw, io.NewSectionReader(f, pos, n)); err != nil {
				return fmt.Errorf("reading %s at %d: %w", path, pos, err)
			}
			pos += n
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := writeU64s(bw, hdr, uint64(size), 0); err != nil {
		return err
	}
	return bw.Flush()
}

func writeU64s(w io.Writer, buf []byte, vals ...uint64) error {
	for i, v := range vals {
		binary.BigEndian.PutUint64(buf[i*8:], v)
	}
	_, err := w.Write(buf[:8*len(vals)])
	return err
}

// ReadExtents writes an extent stream into dst: the data lands in dst+".tmp",
// which is fsynced and renamed to dst only once the end mark arrived, so
// dst never exists partly written. progress is told the data bytes so far
// and the file's size.
func ReadExtents(ctx context.Context, r io.Reader, dst string, progress Progress) (err error) {
	br := bufio.NewReaderSize(r, 1<<20)
	hdr := make([]byte, 16)
	if _, err := io.ReadFull(br, hdr[:16]); err != nil {
		return fmt.Errorf("reading the stream header: %w", err)
	}
	if [8]byte(hdr[:8]) != extentMagic {
		return fmt.Errorf("not an extent stream (header %q)", hdr[:8])
	}
	size := int64(binary.BigEndian.Uint64(hdr[8:16]))
	if size < 0 {
		return fmt.Errorf("extent stream: file size %d", size)
	}
	out, err := createWork(dst, size)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			out.abandon()
		}
	}()
	var done int64
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, err := io.ReadFull(br, hdr); err != nil {
			return fmt.Errorf("the stream ended after %d of the data bytes, before its end mark: %w", done, err)
		}
		off, n := int64(binary.BigEndian.Uint64(hdr[:8])), int64(binary.BigEndian.Uint64(hdr[8:]))
		if n == 0 {
			if off != size {
				return fmt.Errorf("extent stream: end mark for size %d, header said %d", off, size)
			}
			break
		}
		if off < 0 || n > maxExtentFrame || off+n > size {
			return fmt.Errorf("extent stream: frame [%d, +%d) outside a %d-byte file", off, n, size)
		}
		if _, err := io.Copy(io.NewOffsetWriter(out, off), io.LimitReader(br, n)); err != nil {
			return fmt.Errorf("writing %s at %d: %w", out.tmp, off, err)
		}
		done += n
		if progress != nil {
			progress(done, size)
		}
	}
	return out.commit()
}

// FetchExtents GETs url, which answers with an extent stream, into dst (see
// ReadExtents).
func FetchExtents(ctx context.Context, client *http.Client, url, dst string, progress Progress) error {
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, msg)
	}
	if err := ReadExtents(ctx, resp.Body, dst, progress); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}
