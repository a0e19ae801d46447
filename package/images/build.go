package images

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
)

// The references the images are imported under.
const (
	PauseRef    = "localhost/strata/pause:v1"
	WorkloadRef = "localhost/strata/workload:v1"
	StrataRef   = "localhost/strata/strata-manager:dev"
	// FioRef is built only for the benchmarks (BuildFio).
	FioRef = "localhost/strata/fio:v1"
)

// keyVersion goes into every cache key: bump it when this package changes
// what it writes for the same inputs, so old tarballs are not reused.
const keyVersion = "strata-images/3" // 2: Cmd rather than Entrypoint; 3: sidecars' Entrypoint

// Image is a built image: Tar imports as Ref with `ctr images import`.
type Image struct{ Ref, Tar string }

// Tars lists the images' tarballs, in order, for an importer that needs no
// refs (each tarball names its own).
func Tars(imgs []Image) []string {
	tars := make([]string, len(imgs))
	for i, img := range imgs {
		tars[i] = img.Tar
	}
	return tars
}

// Options configures BuildAll.
type Options struct {
	// CacheDir holds the tarballs, under images/; default $STRATA_CACHE or
	// ~/.cache/strata, the cache scripts/build-tools.sh uses.
	CacheDir string
	// ManagerBin is the strata-manager binary for the strata image (required).
	ManagerBin string
	// StrataRef is the strata image's reference; default StrataRef (a test
	// of helm upgrade builds a second one under another tag).
	StrataRef string
	// RepoDir is the strata checkout the pause program is built from;
	// default: the nearest directory holding a go.mod, from the working
	// directory up.
	RepoDir string
	// Sidecars are upstream programs (the CSI sidecars, snapshot-controller)
	// by name -> binary path; each becomes an image SidecarRef(name), built
	// after the other three.
	Sidecars map[string]string
	Log      logrus.FieldLogger
}

// BuildAll builds, or finds in the cache, the pause, workload and strata
// images, in that order. An image is rebuilt only when one of its inputs
// (file contents, reference, cmd) changed, so a second call costs a
// few stats and hashes.
func BuildAll(ctx context.Context, opts Options) ([]Image, error) {
	specs := []func(context.Context, Options) (*spec, error){pauseSpec, workloadSpec, strataSpec}
	for _, name := range slices.Sorted(maps.Keys(opts.Sidecars)) {
		specs = append(specs, func(ctx context.Context, _ Options) (*spec, error) {
			return sidecarSpec(ctx, name, opts.Sidecars[name])
		})
	}
	return buildSpecs(ctx, opts, specs)
}

// BuildFio builds, or finds in the cache, the fio image the benchmarks run
// in Pods (only opts.CacheDir and opts.Log are used).
func BuildFio(ctx context.Context, opts Options) (Image, error) {
	opts.ManagerBin = "unused" // the fio image carries no strata-manager
	imgs, err := buildSpecs(ctx, opts, []func(context.Context, Options) (*spec, error){fioSpec})
	if err != nil {
		return Image{}, err
	}
	return imgs[0], nil
}

// buildSpecs makes each spec's image, or finds it in the cache, in order.
func buildSpecs(ctx context.Context, opts Options, specs []func(context.Context, Options) (*spec, error)) ([]Image, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(opts.CacheDir, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// Two builders at once (two test binaries, say) would each do the same
	// work on two shared cores; the second waits and then finds the cache.
	unlock, err := lockFile(filepath.Join(dir, ".lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	removeLeftovers(dir, opts.Log)
	images := make([]Image, 0, len(specs))
	for _, makeSpec := range specs {
		start := time.Now() // finding tools and hashing inputs count too
		s, err := makeSpec(ctx, opts)
		if err != nil {
			return nil, err
		}
		img, err := ensure(ctx, dir, s, start, opts.Log)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", s.ref, err)
		}
		images = append(images, img)
	}
	return images, nil
}

func (o Options) withDefaults() (Options, error) {
	if o.ManagerBin == "" {
		return o, errors.New("images: Options.ManagerBin (the strata-manager binary) is required")
	}
	if o.Log == nil {
		o.Log = logrus.StandardLogger()
	}
	if o.StrataRef == "" {
		o.StrataRef = StrataRef
	}
	if o.CacheDir == "" {
		o.CacheDir = os.Getenv("STRATA_CACHE")
	}
	if o.CacheDir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return o, fmt.Errorf("images: no CacheDir, no $STRATA_CACHE and no home directory: %w", err)
		}
		o.CacheDir = filepath.Join(home, ".cache", "strata")
	}
	return o, nil
}

// ensure returns s's tarball from the cache, building it first if needed.
func ensure(ctx context.Context, dir string, s *spec, start time.Time, log logrus.FieldLogger) (Image, error) {
	key, err := s.key()
	if err != nil {
		return Image{}, err
	}
	img := Image{Ref: s.ref, Tar: filepath.Join(dir, s.name+"-"+key[:16]+".tar")}
	log = log.WithFields(logrus.Fields{"ref": img.Ref, "tar": img.Tar})
	if _, err := os.Stat(img.Tar); err == nil {
		// The mtime says when the tarball was last used, for pruneOthers.
		now := time.Now()
		_ = os.Chtimes(img.Tar, now, now)
		log.WithField("took", time.Since(start).Round(time.Millisecond)).Info("image up to date (cache)")
		return img, nil
	}
	if err := build(ctx, dir, s, img.Tar); err != nil {
		return Image{}, err
	}
	pruneOthers(dir, s.name, img.Tar, log)
	info, err := os.Stat(img.Tar)
	if err != nil {
		return Image{}, err
	}
	log.WithFields(logrus.Fields{"files": len(s.files), "size": fmt.Sprintf("%.1fMiB", float64(info.Size())/(1<<20)),
		"took": time.Since(start).Round(time.Millisecond)}).Info("image built")
	return img, nil
}

// build stages s's root filesystem in a scratch directory and writes it.
func build(ctx context.Context, dir string, s *spec, out string) error {
	stage, err := os.MkdirTemp(dir, "."+s.name+"-rootfs-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(stage)
	if err := s.stage(stage); err != nil {
		return err
	}
	if s.build != nil {
		if err := s.build(ctx, stage); err != nil {
			return err
		}
	}
	return WriteImageConfig(ctx, stage, s.ref, s.entrypoint, s.cmd, out)
}

// pruneAge is how long a tarball of an older version of an image is kept
// after its last use: long enough for a concurrent run (another checkout,
// another manager build) that got its path to import it.
const pruneAge = 24 * time.Hour

// pruneOthers removes the tarballs of other versions of the image not used
// for pruneAge, which would otherwise pile up with every strata-manager
// build.
func pruneOthers(dir, name, keep string, log logrus.FieldLogger) {
	old, _ := filepath.Glob(filepath.Join(dir, name+"-*.tar"))
	for _, p := range old {
		info, err := os.Stat(p)
		if p == keep || err != nil || time.Since(info.ModTime()) < pruneAge {
			continue
		}
		if err := os.Remove(p); err != nil {
			log.WithError(err).Warn("removing an old image tarball")
		}
	}
}

// removeLeftovers deletes the hidden scratch files and directories of a
// build that was killed (a staged strata root is over 100 MB). Only called with
// the lock held, so no other build is using them.
func removeLeftovers(dir string, log logrus.FieldLogger) {
	names, _ := filepath.Glob(filepath.Join(dir, ".*"))
	for _, p := range names {
		if filepath.Base(p) == ".lock" {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			log.WithError(err).Warn("removing a killed build's scratch files")
		}
	}
}

// file is one path of an image's root filesystem.
type file struct {
	path string      // absolute path in the image
	mode fs.FileMode // type and permission bits
	src  string      // regular file: the host file to copy...
	data []byte      // ...or its content, when src is ""
	link string      // symlink: its target
}

// spec is everything an image is made from.
type spec struct {
	name       string // tarball name prefix in the cache
	ref        string
	entrypoint []string // only where Pods pass args alone (the sidecars)
	cmd        []string
	files      map[string]file
	// keyExtra is further input for the cache key: the sources of what
	// build makes.
	keyExtra []byte
	// build, if set, adds files to the staged root filesystem.
	build func(ctx context.Context, rootfs string) error
}

func newSpec(name, ref string, cmd ...string) *spec {
	return &spec{name: name, ref: ref, cmd: cmd, files: map[string]file{}}
}

// add records f; the same path twice must mean the same file (two tools
// sharing libc, say).
func (s *spec) add(f file) error {
	f.path = filepath.Clean(f.path)
	if old, ok := s.files[f.path]; ok {
		if old.mode != f.mode || old.src != f.src || old.link != f.link || string(old.data) != string(f.data) {
			return fmt.Errorf("%s: added twice, differently", f.path)
		}
		return nil
	}
	s.files[f.path] = f
	return nil
}

func (s *spec) dir(path string, mode fs.FileMode) error {
	return s.add(file{path: path, mode: fs.ModeDir | mode})
}

func (s *spec) symlink(path, target string) error {
	return s.add(file{path: path, mode: fs.ModeSymlink | 0o777, link: target})
}

func (s *spec) data(path string, mode fs.FileMode, data string) error {
	return s.add(file{path: path, mode: mode, data: []byte(data)})
}

// sorted lists the files by path, so parents come before their children.
func (s *spec) sorted() []file {
	files := make([]file, 0, len(s.files))
	for _, f := range s.files {
		files = append(files, f)
	}
	sort.Slice(files, func(i, j int) bool { return files[i].path < files[j].path })
	return files
}

// key is the sha256 of everything the image is made from: reference,
// cmd, every file's path, mode, link target and content, and
// keyExtra. Host mtimes are left out on purpose: reinstalling the same
// package must not cause a rebuild.
func (s *spec) key() (string, error) {
	h := sha256.New()
	field := func(v string) { fmt.Fprintf(h, "%d:%s;", len(v), v) } // length-prefixed: no two inputs collide
	field(keyVersion)
	field(s.ref)
	for _, list := range [][]string{s.entrypoint, s.cmd} {
		field(fmt.Sprint(len(list)))
		for _, arg := range list {
			field(arg)
		}
	}
	for _, f := range s.sorted() {
		field(f.path)
		field(f.mode.String())
		field(f.link)
		sum, err := f.contentSum()
		if err != nil {
			return "", err
		}
		field(sum)
	}
	field(string(s.keyExtra))
	return hex.EncodeToString(h.Sum(nil)), nil
}

func (f file) contentSum() (string, error) {
	if !f.mode.IsRegular() {
		return "", nil
	}
	h := sha256.New()
	if f.src == "" {
		h.Write(f.data)
	} else if err := copyFileTo(h, f.src); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// stage creates the files under root. It refuses a path below one of the
// image's own symlinks: creating it would follow the link, possibly out of
// root onto the host.
func (s *spec) stage(root string) error {
	for _, f := range s.sorted() {
		for p := filepath.Dir(f.path); p != "/"; p = filepath.Dir(p) {
			if parent, ok := s.files[p]; ok && parent.mode&fs.ModeSymlink != 0 {
				return fmt.Errorf("%s: below the symlink %s", f.path, p)
			}
		}
		if err := f.create(filepath.Join(root, f.path)); err != nil {
			return err
		}
	}
	return nil
}

func (f file) create(dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	switch {
	case f.mode.IsDir():
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
	case f.mode&fs.ModeSymlink != 0:
		return os.Symlink(f.link, dst)
	case f.src != "":
		if err := copyFile(f.src, dst); err != nil {
			return err
		}
	default:
		if err := os.WriteFile(dst, f.data, 0o600); err != nil {
			return err
		}
	}
	// Explicitly, since the umask and MkdirAll drop bits (1777 for /tmp,
	// setuid for mount).
	return os.Chmod(dst, f.mode&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
}

func copyFile(src, dst string) error {
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := copyFileTo(out, src); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// lockFile takes an exclusive flock on path, waiting for it; the returned
// function releases it.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// hostFileMode is f's mode as an image file mode: type plus permission,
// setuid, setgid and sticky bits.
func hostFileMode(info fs.FileInfo) fs.FileMode {
	return info.Mode() & (fs.ModeType | fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
}
