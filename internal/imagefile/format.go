// Package imagefile prepares a backing image's file on a disk: it fetches
// the source over HTTP (resuming with Range after an interruption),
// recognises the format, turns raw, qcow2, gzip and xz sources into one
// sparse raw file, verifies its SHA-512, and copies finished files disk to
// disk by their data extents. A half-written file is never the final one:
// work happens under a temporary name, and the result is fsynced and
// renamed into place.
package imagefile

import (
	"bytes"
	"fmt"
	"io"
	"os"
)

// Format is what a source file holds.
type Format string

const (
	FormatRaw   Format = "raw"
	FormatQCOW2 Format = "qcow2"
	FormatGzip  Format = "gzip"
	FormatXZ    Format = "xz"
)

// headerSize is how much of a file DetectFormat wants to see.
const headerSize = 512

// magics of the formats Strata takes, and of the ones it refuses by name:
// a user who uploads a VMDK should read "vmdk", not find a garbled disk.
var magics = []struct {
	format    Format
	magic     []byte
	offset    int
	supported bool
}{
	{FormatQCOW2, []byte("QFI\xfb"), 0, true},
	{FormatGzip, []byte{0x1f, 0x8b}, 0, true},
	{FormatXZ, []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}, 0, true},
	{"vmdk", []byte("KDMV"), 0, false},
	{"vmdk (descriptor)", []byte("# Disk DescriptorFile"), 0, false},
	{"vhdx", []byte("vhdxfile"), 0, false},
	{"vhd", []byte("conectix"), 0, false},
	{"vdi", []byte("<<< Oracle VM VirtualBox Disk Image >>>"), 0, false},
	{"qed", []byte("QED\x00"), 0, false},
	{"zstd", []byte{0x28, 0xb5, 0x2f, 0xfd}, 0, false},
	{"bzip2", []byte("BZh"), 0, false},
	{"zip", []byte("PK\x03\x04"), 0, false},
}

// DetectFormat names the format of a file from its first bytes. Anything
// not recognised is raw (a raw disk has no header); a recognised format
// Strata does not take is an error naming it.
func DetectFormat(header []byte) (Format, error) {
	// A web server's error or login page served with 200 is the most common
	// wrong "image"; as raw it would become a tiny, garbled disk.
	if lower := bytes.ToLower(bytes.TrimSpace(header[:min(len(header), 64)])); bytes.HasPrefix(lower, []byte("<!doctype html")) ||
		bytes.HasPrefix(lower, []byte("<html")) {
		return "html", fmt.Errorf("the source is an HTML page, not an image; is the URL right?")
	}
	for _, m := range magics {
		end := m.offset + len(m.magic)
		if len(header) >= end && bytes.Equal(header[m.offset:end], m.magic) {
			if !m.supported {
				return Format(m.format), notAnImage("the image is %s; raw, qcow2, and gzip or xz of either are supported", m.format)
			}
			return m.format, nil
		}
	}
	return FormatRaw, nil
}

// detectFile reads a file's header and names its format.
func detectFile(path string) (Format, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	header := make([]byte, headerSize)
	n, err := io.ReadFull(f, header)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	return DetectFormat(header[:n])
}
