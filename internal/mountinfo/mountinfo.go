// Package mountinfo reads /proc/self/mountinfo. Written here rather than
// taken from k8s.io/mount-utils because its ParseMountInfo leaves the
// kernel's octal escapes (\040 for a space) in paths, and mount points are
// compared as paths here.
package mountinfo

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

const mountInfoPath = "/proc/self/mountinfo"

// Entry is one line of /proc/self/mountinfo (proc(5)); only the fields
// this package reads. k8s.io/mount-utils is not a dependency of the module,
// and parsing these few fields is simpler than adding it.
// Entry is what callers need of one mount: which device, which part of it,
// where, of which type, from which source.
type Entry struct {
	MajorMinor string // "7:0": the device of the mounted filesystem
	Root       string // path within that filesystem that is mounted (bind mounts)
	MountPoint string
	FSType     string
	Source     string
}

// Read reads this process's mount table.
func Read() ([]Entry, error) {
	f, err := os.Open(mountInfoPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	entries, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", mountInfoPath, err)
	}
	return entries, nil
}

// Parse reads a mountinfo table.
func Parse(r io.Reader) ([]Entry, error) {
	var entries []Entry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		e, err := parseLine(sc.Text())
		if err != nil {
			return nil, err
		}
		entries = append(entries, e)
	}
	return entries, sc.Err()
}

// parseLine reads "id parent maj:min root mountpoint opts [optional...] - fstype source superopts".
// The optional fields vary in number, hence the search for the "-" separator.
func parseLine(line string) (Entry, error) {
	fields := strings.Fields(line)
	sep := -1
	for i := 6; i < len(fields); i++ {
		if fields[i] == "-" {
			sep = i
			break
		}
	}
	if sep < 0 || sep+2 >= len(fields) {
		return Entry{}, fmt.Errorf("malformed mountinfo line %q", line)
	}
	return Entry{
		MajorMinor: fields[2],
		Root:       Unescape(fields[3]),
		MountPoint: Unescape(fields[4]),
		FSType:     fields[sep+1],
		Source:     Unescape(fields[sep+2]),
	}, nil
}

// Unescape undoes the kernel's octal escapes (\040 for a space,
// \011, \012, \134) in mountinfo paths.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
