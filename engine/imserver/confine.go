package imserver

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
)

// The instance manager acts only inside its node's disks (issue 24): its
// gRPC API takes host paths (a replica's data directory and backing file,
// a directory to delete, a file:// backup target), and before this check a
// replica with backing_file=/etc/shadow read the host's files and
// ReplicaDataDelete could remove any replica-looking tree. Every such path
// must resolve, symbolic links followed as far as the path exists, to
// somewhere inside one of the configured roots (strictly, for disks).

// confinement holds the roots the paths in requests must lie under.
type confinement struct {
	disks   []string // replica data and backing files (Options.DiskPaths)
	backups []string // file:// backup targets (Options.BackupPaths)
	// own are the instance manager's own files, never a request's: its
	// state directory, NBD socket and TLS directory.
	own []ownPath
}

type ownPath struct{ what, path string }

func newConfinement(opts Options) (confinement, error) {
	if len(opts.DiskPaths) == 0 {
		return confinement{}, errors.New("no disk paths: every replica would be refused; give the node's disks (--disk-path)")
	}
	c := confinement{}
	for _, o := range []ownPath{{"state directory", opts.StateDir}, {"NBD socket", opts.NBDSocket}, {"TLS directory", opts.TLSDir}} {
		if o.path != "" {
			c.own = append(c.own, ownPath{o.what, filepath.Clean(o.path)})
		}
	}
	for _, roots := range []struct {
		flag string
		in   []string
		out  *[]string
	}{{"--disk-path", opts.DiskPaths, &c.disks}, {"--backup-path", opts.BackupPaths, &c.backups}} {
		for _, p := range roots.in {
			if err := checkRootSpelling(p); err != nil {
				return confinement{}, fmt.Errorf("%s %q: %w", roots.flag, p, err)
			}
			*roots.out = append(*roots.out, filepath.Clean(p))
		}
	}
	return c, nil
}

// checkRootSpelling refuses a root that would confine nothing.
func checkRootSpelling(p string) error {
	switch {
	case !filepath.IsAbs(p):
		return errors.New("must be an absolute path")
	case hasDotDot(p):
		return errors.New("must not contain ..")
	case filepath.Clean(p) == string(filepath.Separator):
		return errors.New("is the root directory, which would let requests reach every file of the host")
	}
	return nil
}

// replica checks a replica's data directory and backing file.
func (c confinement) replica(spec instanceSpec) error {
	err := c.disk("data_dir", spec.DataDir)
	if err == nil && spec.BackingFile != "" {
		err = c.disk("backing_file", spec.BackingFile)
	}
	if err != nil {
		return fmt.Errorf("replica %q: %w", spec.Name, err)
	}
	return nil
}

// disk checks a path a request names for replica data (field is the
// request's field name, for the error).
func (c confinement) disk(field, p string) error {
	return c.check(field, p, c.disks, "this node's disks", false)
}

// backupTarget checks a backup target's URL: a file:// directory must lie
// under a backup path; other schemes name no local path.
func (c confinement) backupTarget(t *impb.BackupTarget) error {
	u, err := url.Parse(t.GetUrl())
	if err != nil || u.Scheme != "file" {
		return nil // StoreFor refuses what does not parse
	}
	if len(c.backups) == 0 {
		return fmt.Errorf("target.url %q: file:// targets are not allowed here (the instance manager has no --backup-path): %w",
			t.GetUrl(), engineapi.ErrInvalid)
	}
	// The mount point itself may be the target.
	return c.check("target.url", u.Path, c.backups, "the backup paths", true)
}

// check refuses p unless it is absolute, has no "..", and resolves to a
// path inside one of roots (strictly, unless orRoot) and apart from the
// state directory and the NBD socket.
func (c confinement) check(field, p string, roots []string, rootsName string, orRoot bool) error {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%s %q %s: %w", field, p, fmt.Sprintf(format, args...), engineapi.ErrInvalid)
	}
	switch {
	case p == "":
		return fmt.Errorf("%s is empty: %w", field, engineapi.ErrInvalid)
	case !filepath.IsAbs(p):
		return invalid("must be an absolute path")
	case hasDotDot(p):
		return invalid("must not contain ..")
	}
	resolved, err := resolveExisting(p)
	if err != nil {
		return invalid("cannot be resolved: %v", err)
	}
	if !insideAny(resolved, roots, orRoot) {
		via := ""
		if resolved != filepath.Clean(p) {
			via = fmt.Sprintf(" (it resolves to %s)", resolved)
		}
		return invalid("is outside %s%s: allowed are paths inside %s", rootsName, via, strings.Join(roots, ", "))
	}
	for _, o := range c.own {
		if p, err := resolveExisting(o.path); err == nil && pathsOverlap(resolved, p) {
			return invalid("overlaps the instance manager's %s %s", o.what, o.path)
		}
	}
	return nil
}

// insideAny tells whether a resolved path lies strictly inside one of
// roots (or is one, if orRoot), each resolved the same way: a root may be a
// link, or not mounted yet.
func insideAny(resolved string, roots []string, orRoot bool) bool {
	for _, root := range roots {
		if r, err := resolveExisting(root); err == nil && (strictlyInside(resolved, r) || orRoot && resolved == r) {
			return true
		}
	}
	return false
}

// hasDotDot tells whether a path, as written, has a ".." element: refused
// even where cleaning would keep it inside a root, so a request means what
// it says.
func hasDotDot(p string) bool {
	return slices.Contains(strings.Split(filepath.ToSlash(p), "/"), "..")
}

func strictlyInside(p, root string) bool {
	return strings.HasPrefix(p, strings.TrimSuffix(root, string(filepath.Separator))+string(filepath.Separator))
}

// resolveExisting follows the symbolic links of p as far as p exists and
// appends the missing rest, which, not existing, cannot be a link. A
// component that exists but cannot be followed (a dangling link, whose
// target a later mkdir or create would follow out of the root; a regular
// file in the middle) is an error.
func resolveExisting(p string) (string, error) {
	p = filepath.Clean(p)
	var missing []string
	for {
		r, err := filepath.EvalSymlinks(p)
		if err == nil {
			return filepath.Join(append([]string{r}, missing...)...), nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		if _, lerr := os.Lstat(p); lerr == nil {
			return "", fmt.Errorf("%s is a symbolic link to nowhere", p)
		}
		parent := filepath.Dir(p)
		if parent == p {
			return "", err
		}
		missing = append([]string{filepath.Base(p)}, missing...)
		p = parent
	}
}
