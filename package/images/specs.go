package images

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/strata-storage/strata/package/hostpackages"
)

// hostBinDirs is where host programs are looked up, in order, instead of
// $PATH: a test or daemon may run with a PATH that lacks /usr/sbin.
var hostBinDirs = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// managerPath is where strata-manager sits in its image.
const managerPath = "/usr/local/bin/strata-manager"

// pauseSpec is the pod sandbox image: the static program in ./pause, alone.
func pauseSpec(ctx context.Context, opts Options) (*spec, error) {
	s := newSpec("pause", PauseRef, "/pause")
	return s, addGoProgram(ctx, s, opts, "pause", "/pause")
}

// addGoProgram has build compile the program in package/images/<dir> of the
// strata checkout, static, to path in the image; its sources and the Go
// version stand in for the binary in the cache key.
func addGoProgram(ctx context.Context, s *spec, opts Options, dir, path string) error {
	repo, err := repoDir(opts.RepoDir)
	if err != nil {
		return err
	}
	pkg := filepath.Join("package", "images", dir)
	sources, err := goSources(filepath.Join(repo, pkg))
	if err != nil {
		return err
	}
	goVersion, err := commandOutput(ctx, repo, "go", "env", "GOVERSION")
	if err != nil {
		return err
	}
	// The binary is made by build, so its inputs stand in for it in the key.
	s.keyExtra = append([]byte(goVersion), sources...)
	s.build = func(ctx context.Context, rootfs string) error {
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w",
			"-o", filepath.Join(rootfs, path), "./"+filepath.ToSlash(pkg))
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building the %s program: %w\n%s", dir, err, out)
		}
		return nil
	}
	return nil
}

// fioSpec is the benchmarks' fio image (scripts/bench-kbench): Debian's
// fio with its libraries, run as the entrypoint.
func fioSpec(ctx context.Context, _ Options) (*spec, error) {
	fio, err := lookTool(hostpackages.Entry{Package: "fio", File: "fio"})
	if err != nil {
		return nil, fmt.Errorf("%w (scripts/host-packages.sh bench installs it)", err)
	}
	s := newSpec("fio", FioRef, fio)
	if err := addProgram(ctx, s, fio, fio); err != nil {
		return nil, err
	}
	return s, baseFiles(s)
}

// workloadSpec is a minimal shell image for test Pods: busybox with every
// applet linked in /bin, and the few files programs expect.
func workloadSpec(ctx context.Context, opts Options) (*spec, error) {
	s := newSpec("workload", WorkloadRef, "/bin/sh")
	if err := addBusybox(ctx, s); err != nil {
		return nil, err
	}
	return s, baseFiles(s)
}

// addBusybox adds Debian's static busybox as /bin/busybox with every applet
// it has linked beside it in /bin (sh among them).
func addBusybox(ctx context.Context, s *spec) error {
	busybox, err := lookTool(hostpackages.Entry{Package: "busybox-static", File: "busybox"})
	if err != nil {
		return err
	}
	if err := addProgram(ctx, s, "/bin/busybox", busybox); err != nil {
		return err
	}
	applets, err := commandOutput(ctx, "", busybox, "--list")
	if err != nil {
		return err
	}
	for _, applet := range strings.Fields(applets) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		if err := s.symlink("/bin/"+applet, "busybox"); err != nil {
			return err
		}
	}
	if _, ok := s.files["/bin/sh"]; !ok {
		return fmt.Errorf("%s has no sh applet; install the Debian package busybox-static", busybox)
	}
	return nil
}

// strataSpec is strata-manager with the host programs it runs, each with
// its shared libraries at the paths ldd found them.
func strataSpec(ctx context.Context, opts Options) (*spec, error) {
	manager, err := filepath.Abs(opts.ManagerBin)
	if err != nil {
		return nil, err
	}
	if info, err := os.Stat(manager); err != nil || !info.Mode().IsRegular() {
		return nil, fmt.Errorf("strata-manager binary %s: not a regular file (%v)", manager, err)
	}
	s := newSpec("strata-manager", opts.StrataRef, managerPath)
	if err := addProgram(ctx, s, managerPath, manager); err != nil {
		return nil, err
	}
	// The programs strata-manager runs: qemu and libnbd for backing images,
	// nbdfuse and the filesystem tools for CSI.
	for _, t := range hostpackages.ForRole(hostpackages.RoleImage) {
		if dataFile(t) {
			if err := addHost(s, t.File); err != nil {
				return nil, fmt.Errorf("%s (Debian %s): %w", t.File, t.Package, err)
			}
			continue
		}
		path, err := lookTool(t)
		if err != nil {
			return nil, err
		}
		if err := addProgram(ctx, s, path, path); err != nil {
			return nil, err
		}
	}
	// mke2fs falls back to built-in defaults without it; ship the host's so
	// filesystems made in the image match those made on the host.
	if _, err := os.Stat("/etc/mke2fs.conf"); err == nil {
		if err := addHost(s, "/etc/mke2fs.conf"); err != nil {
			return nil, err
		}
	}
	return s, errors.Join(baseFiles(s), mergedUsr(s))
}

// dataFile: an entry that names a file under /etc or /usr/share (the CA
// bundle) rather than a program: copied as it is, no libraries to find.
func dataFile(t hostpackages.Entry) bool {
	return strings.HasPrefix(t.File, "/etc/") || strings.HasPrefix(t.File, "/usr/share/")
}

// mergedUsr gives the image the host's /bin, /sbin, /lib and /lib64
// symlinks into /usr (Debian's merged /usr), so a tool called by its
// traditional path, /sbin/mkfs.ext4 say, is found as on the host.
func mergedUsr(s *spec) error {
	for _, dir := range []string{"/bin", "/sbin", "/lib", "/lib64"} {
		if target, err := os.Readlink(dir); err == nil && !filepath.IsAbs(target) {
			if err := s.symlink(dir, target); err != nil {
				return err
			}
		}
	}
	return nil
}

// baseFiles adds a root user and group (programs look up uid 0) and the
// directories a container runtime mounts over or programs write to.
func baseFiles(s *spec) error {
	return errors.Join(
		s.data("/etc/passwd", 0o644, "root:x:0:0:root:/root:/bin/sh\n"),
		s.data("/etc/group", 0o644, "root:x:0:\n"),
		// Where mount, e2fsprogs and others look for the mount table.
		s.symlink("/etc/mtab", "../proc/self/mounts"),
		s.dir("/root", 0o700),
		s.dir("/tmp", 0o777|fs.ModeSticky),
		s.dir("/dev", 0o755),
		s.dir("/proc", 0o555),
		s.dir("/sys", 0o555),
	)
}

// addProgram copies the host program src to path in the image, with every
// shared library it loads (none for a static one).
func addProgram(ctx context.Context, s *spec, path, src string) error {
	if path == src {
		if err := addHost(s, src); err != nil {
			return err
		}
	} else if err := s.add(file{path: path, mode: 0o755, src: src}); err != nil {
		return err
	}
	libs, err := sharedLibs(ctx, src)
	if err != nil {
		return err
	}
	for _, lib := range libs {
		if err := addHost(s, lib); err != nil {
			return fmt.Errorf("library of %s: %w", src, err)
		}
	}
	return nil
}

// sharedLibs lists the absolute paths ldd prints for program: its libraries
// and the dynamic loader.
func sharedLibs(ctx context.Context, program string) ([]string, error) {
	out, err := exec.CommandContext(ctx, "ldd", program).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "not a dynamic executable") {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %w\n%s", program, err, out)
	}
	var libs []string
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasSuffix(line, "=> not found") {
			return nil, fmt.Errorf("ldd %s: %s", program, line)
		}
		// "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x…)", or the
		// loader "/lib64/ld-linux-x86-64.so.2 (0x…)"; the vDSO has no path.
		if _, target, ok := strings.Cut(line, "=> "); ok {
			line = target
		}
		path, _, _ := strings.Cut(line, " (")
		if filepath.IsAbs(path) {
			libs = append(libs, path)
		}
	}
	return libs, nil
}

// addHost adds the host file at path to the image at the same path. Every
// symlink on the way — a directory such as /lib -> usr/lib on a merged-/usr
// Debian, or the file itself, such as libz.so.1 -> libz.so.1.2.13 — becomes
// the same symlink in the image, and the file lands where it really is, so
// every path ldd printed resolves in the image as on the host.
func addHost(s *spec, path string) error {
	return addHostDepth(s, filepath.Clean(path), 0)
}

func addHostDepth(s *spec, path string, depth int) error {
	if depth > 40 { // as the kernel's limit: a symlink loop
		return fmt.Errorf("%s: too many levels of symbolic links", path)
	}
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	cur := "/"
	for i, part := range parts {
		cur = filepath.Join(cur, part)
		info, err := os.Lstat(cur)
		if err != nil {
			return err
		}
		if info.Mode()&fs.ModeSymlink != 0 {
			target, err := os.Readlink(cur)
			if err != nil {
				return err
			}
			if err := s.symlink(cur, target); err != nil {
				return err
			}
			if !filepath.IsAbs(target) {
				target = filepath.Join(filepath.Dir(cur), target)
			}
			rest := filepath.Join(append([]string{target}, parts[i+1:]...)...)
			return addHostDepth(s, rest, depth+1)
		}
		if i == len(parts)-1 {
			if !info.Mode().IsRegular() {
				return fmt.Errorf("%s: not a regular file", cur)
			}
			return s.add(file{path: cur, mode: hostFileMode(info), src: cur})
		}
	}
	return nil
}

// lookTool finds t's program in hostBinDirs (or at its absolute path), or
// says which package to install.
func lookTool(t hostpackages.Entry) (string, error) {
	// An absolute path may go through a directory symlink (/bin on a merged
	// /usr); the image records programs at their real paths.
	candidates := []string{t.File}
	if real, err := filepath.EvalSymlinks(t.File); err == nil && filepath.IsAbs(t.File) {
		candidates[0] = real
	}
	if !filepath.IsAbs(t.File) {
		candidates = candidates[:0]
		for _, dir := range hostBinDirs {
			candidates = append(candidates, filepath.Join(dir, t.File))
		}
	}
	for _, path := range candidates {
		if info, err := os.Stat(path); err == nil && info.Mode().IsRegular() && info.Mode()&0o111 != 0 {
			return path, nil
		}
	}
	return "", fmt.Errorf("%s not found in %s: install the Debian package %s (apt-get install %s)",
		t.File, strings.Join(hostBinDirs, ":"), t.Package, t.Package)
}

// repoDir is dir, or the nearest directory from the working directory up
// that holds a go.mod; it must hold the pause program's sources.
func repoDir(dir string) (string, error) {
	if dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return "", err
		}
		for dir = wd; ; dir = filepath.Dir(dir) {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				break
			}
			if dir == filepath.Dir(dir) {
				return "", fmt.Errorf("no go.mod in %s or above it: set Options.RepoDir to the strata checkout", wd)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "package", "images", "pause", "main.go")); err != nil {
		return "", fmt.Errorf("%s is not a strata checkout (no package/images/pause): %w", dir, err)
	}
	return dir, nil
}

// goSources is the names and contents of a package's non-test Go files.
func goSources(dir string) ([]byte, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	var all []byte
	for _, name := range names { // Glob sorts
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		all = fmt.Appendf(all, "%s %d\n%s", filepath.Base(name), len(b), b)
	}
	return all, nil
}

// commandOutput runs a command and returns its trimmed standard output.
func commandOutput(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			err = fmt.Errorf("%w: %s", err, exitErr.Stderr)
		}
		return "", fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}
