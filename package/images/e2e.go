package images

import (
	"context"
	"errors"
)

// Kubernetes' storage e2e suite (test/conformance, make test-conformance)
// runs its Pods from e2e test images with imagePullPolicy IfNotPresent. No
// registry is reachable here, so each is built from Debian's
// busybox-static under its upstream name (test/utils/image/manifest.go of
// k8s.io/kubernetes v1.36.3) and imported into the nodes' containerd, where
// the kubelet finds it present and pulls nothing. They are the images the
// storage suites (test/e2e/storage/testsuites and the framework code they
// call) name; a suite that names another fails with ErrImagePull, which
// says which.
const e2eRegistry = "registry.k8s.io/e2e-test-images"

const (
	// E2EBusyBoxRef is the suites' default test image: every writer,
	// reader and checker Pod runs a shell script in it.
	E2EBusyBoxRef = e2eRegistry + "/busybox:1.37.0-1"
	// E2EAgnhostRef: exec Pods (agnhost pause), hostexec Pods (pause, then
	// nsenter exec'd in them) and the subPath suite's mounttest containers.
	E2EAgnhostRef = e2eRegistry + "/agnhost:2.63.0"
	// E2ENginxRef: the volumes suite's exec test runs a script in it.
	E2ENginxRef = e2eRegistry + "/nginx:1.15-4"
	// E2EGlibcDNSTestingRef: the multiVolume suite's concurrent-access Pods
	// run a shell loop in it.
	E2EGlibcDNSTestingRef = e2eRegistry + "/glibc-dns-testing:2.0.0"
)

// BuildE2E builds, or finds in the cache, the e2e test images, in the order
// of the refs above (opts.ManagerBin is not needed).
func BuildE2E(ctx context.Context, opts Options) ([]Image, error) {
	opts.ManagerBin = "unused" // no strata-manager in these images
	return buildSpecs(ctx, opts, []func(context.Context, Options) (*spec, error){
		func(ctx context.Context, _ Options) (*spec, error) {
			return e2eShellSpec(ctx, "e2e-busybox", E2EBusyBoxRef, "sh")
		},
		e2eAgnhostSpec,
		e2eNginxSpec,
		func(ctx context.Context, _ Options) (*spec, error) {
			return e2eShellSpec(ctx, "e2e-glibc-dns-testing", E2EGlibcDNSTestingRef, "sh")
		},
	})
}

// e2eShellSpec is busybox with its applets and the base files, run as cmd
// (the suites always give their own command).
func e2eShellSpec(ctx context.Context, name, ref string, cmd ...string) (*spec, error) {
	s := newSpec(name, ref, cmd...)
	if err := addBusybox(ctx, s); err != nil {
		return nil, err
	}
	return s, baseFiles(s)
}

// e2eAgnhostSpec is the shell image with the agnhost stand-in
// (./agnhost) as the entrypoint and pause as its default argument, as
// upstream: Pods pass a subcommand as args, or a command (sh, nsenter, cat)
// that replaces the entrypoint and finds busybox's applets (nsenter first
// the stand-in's own, which falls back to them).
func e2eAgnhostSpec(ctx context.Context, opts Options) (*spec, error) {
	s, err := e2eShellSpec(ctx, "e2e-agnhost", E2EAgnhostRef, "pause")
	if err != nil {
		return nil, err
	}
	s.entrypoint = []string{"/agnhost"}
	// Before busybox's nsenter on PATH: hostexec Pods enter the node's mount
	// namespace through it (agnhost/nsenter.go says why).
	if err := s.symlink("/usr/local/bin/nsenter", "/agnhost"); err != nil {
		return nil, err
	}
	return s, addGoProgram(ctx, s, opts, "agnhost", "/agnhost")
}

// e2eNginxSpec is the shell image serving a page on port 80 with busybox's
// httpd, in the foreground, as the upstream image serves one with nginx.
func e2eNginxSpec(ctx context.Context, _ Options) (*spec, error) {
	const root = "/usr/share/nginx/html"
	s, err := e2eShellSpec(ctx, "e2e-nginx", E2ENginxRef, "httpd", "-f", "-p", "80", "-h", root)
	if err != nil {
		return nil, err
	}
	return s, errors.Join(s.dir(root, 0o755),
		s.data(root+"/index.html", 0o644, "<html><body>Welcome to nginx (busybox httpd, Strata's local stand-in)</body></html>\n"))
}
