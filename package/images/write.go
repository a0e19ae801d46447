// Package images builds the container images a local cluster's kubelet nodes
// run — the pod sandbox (pause), a busybox workload and strata-manager with
// the host tools it drives — without a registry, docker, umoci or skopeo:
// each is one layer made from a directory and written as a docker-archive
// tarball that `ctr -n k8s.io images import` loads under its reference.
//
// The image format is go-containerregistry's (v1/mutate, v1/tarball): its
// packages used here pull in only image-spec, go-digest and
// klauspost/compress, not docker/cli, so there is no reason to hand-write
// manifests.
package images

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/strata-storage/strata/internal/atomicfile"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// epoch is every file's mtime and the image's creation time, so the same
// inputs give the same bytes, and so the same digests, every time.
var epoch = time.Unix(0, 0).UTC()

// imageEnv is what a container gets without its own env: none of these
// images has a shell profile to set PATH.
var imageEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// WriteImage writes the directory rootfsDir as a single-layer linux/amd64
// image whose default command is cmd (a Pod's command or args, or
// `kubectl run -- ARGS`, replace it, as with Docker's busybox image) to
// out, a docker-archive tarball naming
// ref (for example localhost/strata/pause:v1). Files, directories and
// symlinks keep their paths and modes; owners become root and mtimes the
// epoch, so equal trees give byte-identical tarballs. out appears only once
// complete.
func WriteImage(ctx context.Context, rootfsDir, ref string, cmd []string, out string) error {
	return WriteImageConfig(ctx, rootfsDir, ref, nil, cmd, out)
}

// WriteImageConfig is WriteImage with an entrypoint too: a Pod's args then
// replace cmd only, as with the upstream sidecar images.
func WriteImageConfig(ctx context.Context, rootfsDir, ref string, entrypoint, cmd []string, out string) error {
	// StrictValidation: an explicit tag, so ctr imports exactly ref rather
	// than a ":latest" it made up.
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("image reference %q: %w", ref, err)
	}
	layerFile, err := createTemp(out, "layer")
	if err != nil {
		return err
	}
	defer os.Remove(layerFile.Name())
	if err := writeLayer(ctx, rootfsDir, layerFile); err != nil {
		layerFile.Close()
		return fmt.Errorf("layer of %s: %w", rootfsDir, err)
	}
	if err := layerFile.Close(); err != nil {
		return err
	}
	img, err := imageFromLayer(layerFile.Name(), entrypoint, cmd)
	if err != nil {
		return err
	}
	return atomicfile.WriteFunc(out, 0o644, func(w io.Writer) error { return tarball.Write(tag, img, w) })
}

// imageFromLayer wraps a gzipped layer in a linux/amd64 image config.
func imageFromLayer(layerPath string, entrypoint, cmd []string) (v1.Image, error) {
	// The layer is already gzipped, so tarball keeps its bytes as they are
	// (and with them the digest we made deterministic).
	layer, err := tarball.LayerFromFile(layerPath)
	if err != nil {
		return nil, err
	}
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{
		Architecture: "amd64",
		OS:           "linux",
		Created:      v1.Time{Time: epoch},
		Config:       v1.Config{Entrypoint: entrypoint, Cmd: cmd, Env: imageEnv, WorkingDir: "/"},
		RootFS:       v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, err
	}
	return mutate.Append(img, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "strata package/images"},
	})
}

// writeLayer writes rootfsDir as a gzipped tar to w. WalkDir visits entries
// in lexical order, which is what makes the order deterministic.
func writeLayer(ctx context.Context, rootfsDir string, w io.Writer) error {
	// BestSpeed: the tarballs live on the local disk and are imported once,
	// so the 2-3x faster compression is worth more than a few MB.
	gz, err := gzip.NewWriterLevel(w, gzip.BestSpeed)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(gz)
	err = filepath.WalkDir(rootfsDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if path == rootfsDir {
			return nil
		}
		return addToLayer(tw, rootfsDir, path, d)
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}

// addToLayer writes one entry: the header fields that vary between machines
// or runs (owner names, times) are left out or fixed.
func addToLayer(tw *tar.Writer, root, path string, d fs.DirEntry) error {
	info, err := d.Info()
	if err != nil {
		return err
	}
	rel, err := filepath.Rel(root, path)
	if err != nil {
		return err
	}
	hdr := &tar.Header{Name: filepath.ToSlash(rel), Mode: tarMode(info.Mode()), ModTime: epoch}
	switch mode := info.Mode(); {
	case mode.IsDir():
		hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
	case mode&fs.ModeSymlink != 0:
		hdr.Typeflag = tar.TypeSymlink
		if hdr.Linkname, err = os.Readlink(path); err != nil {
			return err
		}
	case mode.IsRegular():
		hdr.Typeflag, hdr.Size = tar.TypeReg, info.Size()
	default:
		return fmt.Errorf("%s: unsupported file type %s", path, mode.Type())
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if hdr.Typeflag != tar.TypeReg {
		return nil
	}
	return copyFileTo(tw, path)
}

func copyFileTo(w io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

// tarMode is the permission bits plus setuid, setgid and sticky in tar's
// encoding (Go's fs.FileMode keeps those three elsewhere).
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	for _, bit := range []struct {
		fs  fs.FileMode
		tar int64
	}{{fs.ModeSetuid, 0o4000}, {fs.ModeSetgid, 0o2000}, {fs.ModeSticky, 0o1000}} {
		if m&bit.fs != 0 {
			mode |= bit.tar
		}
	}
	return mode
}

// createTemp makes a temporary file next to path (same filesystem, so a
// rename is atomic), hidden, so a glob for finished files never sees it.
func createTemp(path, what string) (*os.File, error) {
	return os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"."+what+"-*")
}
