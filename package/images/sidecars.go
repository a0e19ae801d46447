package images

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
)

// sidecarName is what a sidecar's name may be: it becomes a path and an
// image reference.
var sidecarName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

// SidecarRef is the reference of the image of the upstream program name
// (csi-provisioner, snapshot-controller, ...). The tag is fixed like
// StrataRef's: the cache key, not the tag, follows the binary's content.
func SidecarRef(name string) string { return "localhost/strata/" + name + ":local" }

// sidecarSpec is a drop-in for the upstream image registry.k8s.io/
// sig-storage/<name> as the chart runs it (args only): the static binary at
// /<name> and that as the entrypoint, with the libraries it loads (the
// proxy's builds use cgo) and the base files a Go program may look at.
func sidecarSpec(ctx context.Context, name, bin string) (*spec, error) {
	if !sidecarName.MatchString(name) {
		return nil, fmt.Errorf("sidecar name %q: lower-case letters, digits and dashes only", name)
	}
	info, err := os.Stat(bin)
	if err != nil {
		return nil, fmt.Errorf("sidecar %s: %w", name, err)
	}
	if !info.Mode().IsRegular() || info.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("sidecar %s: %s is not an executable file", name, bin)
	}
	s := newSpec(name, SidecarRef(name))
	s.entrypoint = []string{"/" + name}
	if err := addProgram(ctx, s, "/"+name, bin); err != nil {
		return nil, err
	}
	return s, errors.Join(baseFiles(s), mergedUsr(s))
}
