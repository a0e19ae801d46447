package images

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/package/hostpackages"
)

const testRef = "localhost/strata/test:v1"

// entry is what a test expects of one layer entry.
type entry struct {
	typ     byte
	mode    int64
	link    string
	content string
}

// image is a docker-archive tarball, read back and checked for consistency.
type image struct {
	repoTags []string
	config   *v1.ConfigFile
	names    []string // layer entries, in order
	entries  map[string]*tar.Header
	contents map[string]string
}

func TestWriteImageLayerAndConfig(t *testing.T) {
	root := testTree(t)
	out := filepath.Join(t.TempDir(), "img.tar")
	require.NoError(t, WriteImage(context.Background(), root, testRef, []string{"/bin/tool", "--flag"}, out))

	img := readImage(t, out)
	assert.Equal(t, []string{testRef}, img.repoTags)
	assert.Equal(t, "amd64", img.config.Architecture)
	assert.Equal(t, "linux", img.config.OS)
	assert.Equal(t, []string{"/bin/tool", "--flag"}, img.config.Config.Cmd)
	assert.Equal(t, imageEnv, img.config.Config.Env)
	// Lexical order, directories before what they hold.
	assert.Equal(t, []string{"bin/", "bin/link", "bin/tool", "etc/", "etc/conf", "tmp/",
		"usr/", "usr/bin/", "usr/bin/su", "var/", "var/empty/"}, img.names)

	want := map[string]entry{
		"bin/":       {tar.TypeDir, 0o755, "", ""},
		"bin/link":   {tar.TypeSymlink, 0o777, "tool", ""},
		"bin/tool":   {tar.TypeReg, 0o755, "", "#!tool\n"},
		"etc/conf":   {tar.TypeReg, 0o644, "", "x=1\n"},
		"tmp/":       {tar.TypeDir, 0o1777, "", ""},
		"usr/bin/su": {tar.TypeReg, 0o4755, "", "su"},
		"var/empty/": {tar.TypeDir, 0o700, "", ""},
	}
	for name, w := range want {
		t.Run(name, func(t *testing.T) {
			hdr := img.entries[name]
			require.NotNil(t, hdr)
			assert.Equal(t, w.typ, hdr.Typeflag)
			assert.Equal(t, w.mode, hdr.Mode, "mode %o", hdr.Mode)
			assert.Equal(t, w.link, hdr.Linkname)
			assert.Equal(t, w.content, img.contents[name])
			assert.Zero(t, hdr.Uid)
			assert.Zero(t, hdr.Gid)
			assert.True(t, hdr.ModTime.Equal(epoch), "mtime %v", hdr.ModTime)
		})
	}
}

// Equal trees give equal bytes, whatever their mtimes.
func TestWriteImageIsDeterministic(t *testing.T) {
	root := testTree(t)
	dir := t.TempDir()
	first, second := filepath.Join(dir, "1.tar"), filepath.Join(dir, "2.tar")
	require.NoError(t, WriteImage(context.Background(), root, testRef, []string{"/bin/tool"}, first))
	later := time.Now().Add(time.Hour)
	require.NoError(t, filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chtimes(p, later, later)
	}))
	require.NoError(t, WriteImage(context.Background(), root, testRef, []string{"/bin/tool"}, second))
	a, err := os.ReadFile(first)
	require.NoError(t, err)
	b, err := os.ReadFile(second)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(a, b), "two writes of one tree differ")
}

// A failed write leaves neither the output nor temporary files behind.
func TestWriteImageFailures(t *testing.T) {
	for _, tc := range []struct {
		name, ref, want string
		tree            func(t *testing.T, root string)
	}{
		{name: "no tag", ref: "localhost/strata/test", want: "image reference"},
		{name: "bad ref", ref: "Not A Ref:v1", want: "image reference"},
		{name: "fifo", ref: testRef, want: "unsupported file type", tree: func(t *testing.T, root string) {
			require.NoError(t, syscall.Mkfifo(filepath.Join(root, "etc", "fifo"), 0o644))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := testTree(t)
			if tc.tree != nil {
				tc.tree(t, root)
			}
			dir := t.TempDir()
			err := WriteImage(context.Background(), root, tc.ref, []string{"/bin/tool"}, filepath.Join(dir, "img.tar"))
			require.ErrorContains(t, err, tc.want)
			left, _ := os.ReadDir(dir)
			assert.Empty(t, left)
		})
	}
}

// The key follows every input but host mtimes.
func TestSpecKey(t *testing.T) {
	src := filepath.Join(t.TempDir(), "prog")
	writeFile(t, src, "v1", 0o755)
	base := func() *spec {
		s := newSpec("test", testRef, "/bin/prog", "run")
		require.NoError(t, s.add(file{path: "/bin/prog", mode: 0o755, src: src}))
		require.NoError(t, s.symlink("/bin/alias", "prog"))
		require.NoError(t, s.data("/etc/passwd", 0o644, "root:x:0:0::/:/bin/sh\n"))
		return s
	}
	baseKey, err := base().key()
	require.NoError(t, err)

	for _, tc := range []struct {
		name    string
		change  func(s *spec)
		changes bool
	}{
		{"same inputs", func(*spec) {}, false},
		{"host mtime", func(*spec) {
			later := time.Now().Add(time.Hour)
			require.NoError(t, os.Chtimes(src, later, later))
		}, false},
		{"file content", func(*spec) { writeFile(t, src, "v2", 0o755) }, true},
		{"data content", func(s *spec) { s.files["/etc/passwd"] = file{path: "/etc/passwd", mode: 0o644, data: []byte("x")} }, true},
		{"mode", func(s *spec) { f := s.files["/bin/prog"]; f.mode = 0o700; s.files[f.path] = f }, true},
		{"link target", func(s *spec) {
			s.files["/bin/alias"] = file{path: "/bin/alias", mode: 0o777 | os.ModeSymlink, link: "other"}
		}, true},
		{"new file", func(s *spec) { require.NoError(t, s.dir("/tmp", 0o777|os.ModeSticky)) }, true},
		{"ref", func(s *spec) { s.ref = "localhost/strata/test:v2" }, true},
		{"cmd split", func(s *spec) { s.cmd = []string{"/bin/prog run"} }, true},
		{"extra input", func(s *spec) { s.keyExtra = []byte("go1.99") }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			writeFile(t, src, "v1", 0o755)
			s := base()
			tc.change(s)
			key, err := s.key()
			require.NoError(t, err)
			assert.Equal(t, tc.changes, key != baseKey)
		})
	}
}

func TestSpecAddTwice(t *testing.T) {
	s := newSpec("test", testRef)
	require.NoError(t, s.symlink("/lib", "usr/lib"))
	require.NoError(t, s.symlink("/lib/", "usr/lib"), "the same file twice is fine")
	assert.ErrorContains(t, s.symlink("/lib", "usr/lib64"), "added twice")
}

// Host symlinks on the way to a file, in directories or the file itself,
// become image symlinks, and the file lands where it really is.
func TestAddHostFollowsSymlinks(t *testing.T) {
	d := t.TempDir()
	writeFile(t, filepath.Join(d, "usr", "lib", "libz.so.1.2"), "elf", 0o644)
	require.NoError(t, os.Symlink("libz.so.1.2", filepath.Join(d, "usr", "lib", "libz.so.1")))
	require.NoError(t, os.Symlink("usr/lib", filepath.Join(d, "lib")))

	s := newSpec("test", testRef)
	require.NoError(t, addHost(s, filepath.Join(d, "lib", "libz.so.1")))
	assert.Equal(t, "usr/lib", s.files[filepath.Join(d, "lib")].link)
	assert.Equal(t, "libz.so.1.2", s.files[filepath.Join(d, "usr", "lib", "libz.so.1")].link)
	target := s.files[filepath.Join(d, "usr", "lib", "libz.so.1.2")]
	assert.Equal(t, os.FileMode(0o644), target.mode)
	assert.Len(t, s.files, 3)

	stage := t.TempDir()
	require.NoError(t, s.stage(stage))
	got, err := os.ReadFile(filepath.Join(stage, d, "lib", "libz.so.1"))
	require.NoError(t, err)
	assert.Equal(t, "elf", string(got))
}

// Staging never writes through one of the image's own symlinks, which
// could point out of the staging directory.
func TestStageRefusesPathsBelowSymlinks(t *testing.T) {
	s := newSpec("test", testRef)
	require.NoError(t, s.symlink("/lib", "/"))
	require.NoError(t, s.data("/lib/evil", 0o644, "x"))
	assert.ErrorContains(t, s.stage(t.TempDir()), "below the symlink /lib")
}

func TestSharedLibs(t *testing.T) {
	if _, err := os.Stat("/usr/bin/busybox"); err == nil {
		libs, err := sharedLibs(context.Background(), "/usr/bin/busybox")
		require.NoError(t, err)
		assert.Empty(t, libs, "busybox-static is static")
	}
	libs, err := sharedLibs(context.Background(), "/bin/sh")
	require.NoError(t, err)
	joined := strings.Join(libs, " ")
	assert.Contains(t, joined, "/libc.so.6")
	assert.Contains(t, joined, "/ld-linux-x86-64.so.2")
}

func TestLookToolNamesThePackage(t *testing.T) {
	_, err := lookTool(hostpackages.Entry{Package: "some-package", File: "no-such-tool-here"})
	assert.ErrorContains(t, err, "install the Debian package some-package")
}

// BuildAll end to end: three images, then the cache, then a rebuild of just
// the image whose input changed. Builds real images (a few seconds).
func TestBuildAllCaches(t *testing.T) {
	if testing.Short() {
		t.Skip("builds images")
	}
	manager := filepath.Join(t.TempDir(), "strata-manager")
	busybox, err := lookTool(hostpackages.Entry{Package: "busybox-static", File: "busybox"})
	require.NoError(t, err)
	copyForTest(t, busybox, manager) // any static program will do
	opts := Options{CacheDir: t.TempDir(), ManagerBin: manager, Log: logrus.New()}

	first, err := BuildAll(context.Background(), opts)
	require.NoError(t, err)
	require.Len(t, first, 3)
	for i, ref := range []string{PauseRef, WorkloadRef, StrataRef} {
		assert.Equal(t, ref, first[i].Ref)
		assert.Equal(t, []string{ref}, readImage(t, first[i].Tar).repoTags)
	}
	checkWorkload(t, readImage(t, first[1].Tar))
	strata := readImage(t, first[2].Tar)
	assert.Equal(t, []string{managerPath}, strata.config.Config.Cmd)
	assert.Contains(t, strata.entries, "usr/bin/qemu-img")
	assert.Contains(t, strata.entries, "etc/ssl/certs/ca-certificates.crt", "HTTPS to S3 and image servers")

	before := stats(t, first)
	again, err := BuildAll(context.Background(), opts)
	require.NoError(t, err)
	assert.Equal(t, first, again)
	for i, info := range stats(t, again) {
		assert.True(t, os.SameFile(before[i], info), "cached %s was rewritten", again[i].Ref)
	}

	appendTo(t, manager, "changed")
	changed, err := BuildAll(context.Background(), opts)
	require.NoError(t, err)
	assert.Equal(t, first[:2], changed[:2])
	assert.NotEqual(t, first[2].Tar, changed[2].Tar)
	assert.FileExists(t, first[2].Tar, "a recently used tarball is kept")

	// Once unused for pruneAge, an old version goes at the next build.
	old := time.Now().Add(-pruneAge - time.Hour)
	require.NoError(t, os.Chtimes(first[2].Tar, old, old))
	appendTo(t, manager, "again")
	_, err = BuildAll(context.Background(), opts)
	require.NoError(t, err)
	assert.NoFileExists(t, first[2].Tar)
	assert.FileExists(t, changed[2].Tar)
}

func checkWorkload(t *testing.T, img *image) {
	assert.Equal(t, []string{"/bin/sh"}, img.config.Config.Cmd)
	assert.Equal(t, "busybox", img.entries["bin/sh"].Linkname)
	assert.Equal(t, int64(0o1777), img.entries["tmp/"].Mode)
	assert.Contains(t, img.contents["etc/passwd"], "root:x:0:0:")
	for _, dir := range []string{"dev/", "proc/", "sys/"} {
		assert.Contains(t, img.entries, dir)
	}
}

func stats(t *testing.T, imgs []Image) []os.FileInfo {
	var infos []os.FileInfo
	for _, img := range imgs {
		info, err := os.Stat(img.Tar)
		require.NoError(t, err)
		infos = append(infos, info)
	}
	return infos
}

func appendTo(t *testing.T, path, text string) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(text)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

// testTree is a root filesystem with each kind of entry and mode WriteImage
// must keep.
func testTree(t *testing.T) string {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "bin", "tool"), "#!tool\n", 0o755)
	require.NoError(t, os.Symlink("tool", filepath.Join(root, "bin", "link")))
	writeFile(t, filepath.Join(root, "etc", "conf"), "x=1\n", 0o644)
	writeFile(t, filepath.Join(root, "usr", "bin", "su"), "su", 0o755)
	require.NoError(t, os.Chmod(filepath.Join(root, "usr", "bin", "su"), 0o755|os.ModeSetuid))
	require.NoError(t, os.Mkdir(filepath.Join(root, "tmp"), 0o755))
	require.NoError(t, os.Chmod(filepath.Join(root, "tmp"), 0o777|os.ModeSticky))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "var", "empty"), 0o755))
	require.NoError(t, os.Chmod(filepath.Join(root, "var", "empty"), 0o700))
	return root
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(content), mode))
	require.NoError(t, os.Chmod(path, mode))
}

func copyForTest(t *testing.T, src, dst string) {
	b, err := os.ReadFile(src)
	require.NoError(t, err)
	writeFile(t, dst, string(b), 0o755)
}

// readImage reads a docker-archive tarball and checks that its parts agree:
// the config is named by its digest, the layer file by the digest of its
// bytes, and the config's diff_id is the digest of the unzipped layer.
func readImage(t *testing.T, path string) *image {
	files := readTar(t, path)
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	require.NoError(t, json.Unmarshal(files["manifest.json"], &manifest))
	require.Len(t, manifest, 1)
	m := manifest[0]
	cfgBytes := files[m.Config]
	require.NotNil(t, cfgBytes, "config %s missing", m.Config)
	assert.Equal(t, "sha256:"+sha(cfgBytes), m.Config)
	cfg, err := v1.ParseConfigFile(bytes.NewReader(cfgBytes))
	require.NoError(t, err)

	require.Len(t, m.Layers, 1)
	layer := files[m.Layers[0]]
	assert.Equal(t, sha(layer)+".tar.gz", m.Layers[0])
	zr, err := gzip.NewReader(bytes.NewReader(layer))
	require.NoError(t, err)
	raw, err := io.ReadAll(zr)
	require.NoError(t, err)
	require.Len(t, cfg.RootFS.DiffIDs, 1)
	assert.Equal(t, "sha256:"+sha(raw), cfg.RootFS.DiffIDs[0].String())

	img := &image{repoTags: m.RepoTags, config: cfg, entries: map[string]*tar.Header{}, contents: map[string]string{}}
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return img
		}
		require.NoError(t, err)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		img.names = append(img.names, hdr.Name)
		img.entries[hdr.Name], img.contents[hdr.Name] = hdr, string(b)
	}
}

func readTar(t *testing.T, path string) map[string][]byte {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files
		}
		require.NoError(t, err)
		files[hdr.Name], err = io.ReadAll(tr)
		require.NoError(t, err)
	}
}

func sha(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// A sidecar image is a drop-in for the upstream one as the chart runs it
// (args only): the program at /<name>, executable, as the entrypoint, with
// only the base files beside it, or with its libraries if it is dynamic
// (build-tools.sh's builds use cgo). A second build finds every image in the
// cache; a changed binary rebuilds its image alone, under the same ref.
func TestBuildAllSidecars(t *testing.T) {
	if testing.Short() {
		t.Skip("builds images")
	}
	dir := t.TempDir()
	busybox, err := lookTool(hostpackages.Entry{Package: "busybox-static", File: "busybox"})
	require.NoError(t, err)
	manager := filepath.Join(dir, "strata-manager")
	copyForTest(t, busybox, manager)
	static := buildStaticProgram(t)
	dynamic, err := lookTool(hostpackages.Entry{Package: "coreutils", File: "true"})
	require.NoError(t, err)
	libs, err := sharedLibs(context.Background(), dynamic)
	require.NoError(t, err)
	require.NotEmpty(t, libs, "%s should be dynamically linked", dynamic)

	tests := []struct {
		name, src string
		libs      []string // host paths the image must hold too
	}{
		{name: "csi-provisioner", src: dynamic, libs: libs},
		{name: "csi-attacher", src: static},
		{name: "csi-resizer", src: static},
		{name: "csi-snapshotter", src: static},
		{name: "snapshot-controller", src: static},
	}
	sidecars := map[string]string{}
	for _, tc := range tests {
		// One file per name, as build-tools.sh leaves them.
		sidecars[tc.name] = filepath.Join(dir, tc.name)
		copyForTest(t, tc.src, sidecars[tc.name])
	}
	opts := Options{CacheDir: t.TempDir(), ManagerBin: manager, Log: logrus.New(), Sidecars: sidecars}

	first, err := BuildAll(context.Background(), opts)
	require.NoError(t, err)
	require.Len(t, first, 3+len(tests))
	byRef := map[string]Image{}
	for _, img := range first[3:] {
		byRef[img.Ref] = img
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ref := SidecarRef(tc.name)
			assert.Equal(t, "localhost/strata/"+tc.name+":local", ref)
			require.Contains(t, byRef, ref)
			img := readImage(t, byRef[ref].Tar)
			assert.Equal(t, []string{ref}, img.repoTags)
			assert.Equal(t, []string{"/" + tc.name}, img.config.Config.Entrypoint)
			assert.Empty(t, img.config.Config.Cmd, "the Pod's args are the program's")
			bin := img.entries[tc.name]
			require.NotNil(t, bin, "no /%s", tc.name)
			assert.Equal(t, byte(tar.TypeReg), bin.Typeflag)
			assert.Equal(t, int64(0o755), bin.Mode)
			want, err := os.ReadFile(tc.src)
			require.NoError(t, err)
			assert.Equal(t, sha(want), sha([]byte(img.contents[tc.name])))
			assert.Equal(t, int64(0o1777), img.entries["tmp/"].Mode)
			assert.Contains(t, img.contents["etc/passwd"], "root:x:0:0:")

			// A static program gets the base files alone; a dynamic one its
			// libraries too, each at (or linked from) the path ldd printed.
			regular := []string{"etc/group", "etc/passwd", tc.name}
			for _, lib := range tc.libs {
				real, ok := resolveInImage(img, lib)
				if assert.True(t, ok, "%s does not resolve in the image", lib) {
					regular = append(regular, real)
				}
			}
			var got []string
			for _, name := range img.names {
				if img.entries[name].Typeflag == tar.TypeReg {
					got = append(got, name)
				}
			}
			assert.ElementsMatch(t, regular, got)
		})
	}

	before := stats(t, first)
	again, err := BuildAll(context.Background(), opts)
	require.NoError(t, err)
	assert.Equal(t, first, again)
	for i, info := range stats(t, again) {
		assert.True(t, os.SameFile(before[i], info), "cached %s was rewritten", again[i].Ref)
	}

	appendTo(t, sidecars["csi-attacher"], "changed")
	changed, err := BuildAll(context.Background(), opts)
	require.NoError(t, err)
	for i := range first {
		if first[i].Ref == SidecarRef("csi-attacher") {
			assert.Equal(t, first[i].Ref, changed[i].Ref)
			assert.NotEqual(t, first[i].Tar, changed[i].Tar, "a changed binary rebuilds its image")
		} else {
			assert.Equal(t, first[i], changed[i])
		}
	}
}

// Bad sidecar input is refused with the reason, before anything is built
// under a path made from it.
func TestBuildAllSidecarsRefuses(t *testing.T) {
	dir := t.TempDir()
	busybox, err := lookTool(hostpackages.Entry{Package: "busybox-static", File: "busybox"})
	require.NoError(t, err)
	bin, notExec := filepath.Join(dir, "bin"), filepath.Join(dir, "notexec")
	copyForTest(t, busybox, bin)
	writeFile(t, notExec, "data", 0o644)
	tests := []struct {
		name, sidecar, bin, wantErr string
	}{
		{"a name that is a path", "../x", bin, `sidecar name "../x": lower-case letters, digits and dashes only`},
		{"an upper-case name", "CSI", bin, `sidecar name "CSI"`},
		{"an empty name", "", bin, `sidecar name ""`},
		{"a missing binary", "csi-missing", filepath.Join(dir, "missing"), "sidecar csi-missing: stat"},
		{"a directory", "csi-dir", dir, "is not an executable file"},
		{"a file not executable", "csi-data", notExec, "is not an executable file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sidecarSpec(context.Background(), tc.sidecar, tc.bin)
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

// resolveInImage follows path through the image's own symlinks, as the
// container's loader would, to the regular file it names.
func resolveInImage(img *image, path string) (string, bool) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i, hops := 0, 0; i < len(parts); i++ {
		cur := strings.Join(parts[:i+1], "/")
		hdr, ok := img.entries[cur]
		if !ok {
			hdr, ok = img.entries[cur+"/"]
		}
		if !ok || hops > 40 {
			return "", false
		}
		if hdr.Typeflag == tar.TypeSymlink {
			target := hdr.Linkname
			if !filepath.IsAbs(target) {
				target = filepath.Join("/", filepath.Dir("/"+cur), target)
			}
			parts = append(strings.Split(strings.Trim(target, "/"), "/"), parts[i+1:]...)
			i, hops = -1, hops+1
			continue
		}
		if i == len(parts)-1 {
			return cur, hdr.Typeflag == tar.TypeReg
		}
	}
	return "", false
}

// buildStaticProgram builds a tiny static Go program, as the pause image's,
// to stand in for an upstream sidecar.
func buildStaticProgram(t *testing.T) string {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "main.go"),
		"package main\n\nimport \"os\"\n\nfunc main() { os.Stdout.WriteString(\"fake sidecar\\n\") }\n", 0o644)
	out := filepath.Join(dir, "sidecar")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "main.go")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)
	libs, err := sharedLibs(context.Background(), out)
	require.NoError(t, err)
	require.Empty(t, libs, "CGO_ENABLED=0 gives a static program")
	return out
}
