package benchscale

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

const benchImage = "bench-image"

func imageVolumeName(i int) string { return fmt.Sprintf("bench-bi-%03d", i) }

// stepBackingImages puts -image-volumes volumes on one backing image (a
// 4 MiB raw image this process serves over HTTP), has each attached once
// (a snapshot of it), so their replicas start on the image and a copy lands
// on every disk they use, and waits until every copy is ready: the quiet
// window then holds a settled image and its users, which must cost nothing.
func (b *bench) stepBackingImages(ctx context.Context) error {
	n := min(b.cfg.imageVolumes, b.cfg.volumes)
	if n == 0 {
		b.log.Info("-image-volumes 0: no backing image")
		return nil
	}
	url, err := b.serveImage(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	bi := &v1beta1.BackingImage{ObjectMeta: metav1.ObjectMeta{Name: benchImage, Namespace: ns},
		Spec: v1beta1.BackingImageSpec{SourceType: v1beta1.BackingImageSourceTypeDownload,
			SourceParameters: map[string]string{v1beta1.BackingImageParameterURL: url}}}
	if err := retryCreate(ctx, "create backing image", func() error {
		_, err := b.strata.StrataV1beta1().BackingImages(ns).Create(ctx, bi, metav1.CreateOptions{})
		return err
	}); err != nil {
		return err
	}
	if _, err := b.waitCount(ctx, "backing image fetched", 1, b.imageCopiesReady(1), b.describeImage); err != nil {
		return err
	}
	err = parallel(ctx, n, b.cfg.workers, func(ctx context.Context, i int) error {
		v := &v1beta1.Volume{ObjectMeta: metav1.ObjectMeta{Name: imageVolumeName(i), Namespace: ns},
			Spec: v1beta1.VolumeSpec{Size: b.cfg.size, NumberOfReplicas: int32(b.cfg.replicas),
				Frontend: v1beta1.VolumeFrontendNBD, BackingImage: benchImage}}
		if err := retryCreate(ctx, "create volume "+v.Name, func() error {
			_, err := b.strata.StrataV1beta1().Volumes(ns).Create(ctx, v, metav1.CreateOptions{})
			return err
		}); err != nil {
			return err
		}
		snap := &v1beta1.Snapshot{ObjectMeta: metav1.ObjectMeta{Name: imageVolumeName(i) + "-s0", Namespace: ns},
			Spec: v1beta1.SnapshotSpec{Volume: v.Name, CreateSnapshot: true}}
		ready := b.snaps.await(snap.Name)
		if err := retryCreate(ctx, "create snapshot "+snap.Name, func() error {
			_, err := b.strata.StrataV1beta1().Snapshots(ns).Create(ctx, snap, metav1.CreateOptions{})
			return err
		}); err != nil {
			return err
		}
		select {
		case <-ready:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Minute):
			return fmt.Errorf("snapshot %s of a volume on the backing image: not ReadyToUse after 5 minutes", snap.Name)
		}
	})
	if err != nil {
		return err
	}
	if _, err := b.waitCount(ctx, "backing image copies ready", 1, b.imageCopiesReady(min(nodeCount, b.cfg.replicas)), b.describeImage); err != nil {
		return err
	}
	b.info(fmt.Sprintf("%d volumes on a backing image, each attached once", n), fmtDur(time.Since(start)))
	return nil
}

// serveImage writes a 4 MiB raw image and serves it on loopback until ctx ends.
func (b *bench) serveImage(ctx context.Context) (string, error) {
	dir, err := os.MkdirTemp(b.cfg.runDir, "image-")
	if err != nil {
		return "", err
	}
	img := make([]byte, 4<<20)
	if _, err := rand.Read(img[:1<<20]); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "image.raw"), img, 0o644); err != nil {
		return "", err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: http.FileServer(http.Dir(dir)), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	go func() { <-ctx.Done(); _ = srv.Close() }()
	return "http://" + l.Addr().String() + "/image.raw", nil
}

// imageCopiesReady counts 1 once the bench image has at least want wanted
// copies, all ready.
func (b *bench) imageCopiesReady(want int) func() int {
	return func() int {
		bi, err := b.strata.StrataV1beta1().BackingImages(ns).Get(context.Background(), benchImage, metav1.GetOptions{})
		if err != nil || len(bi.Spec.DiskFileSpecMap) < want {
			return 0
		}
		for d := range bi.Spec.DiskFileSpecMap {
			if st := bi.Status.DiskFileStatusMap[d]; st == nil || st.State != v1beta1.BackingImageStateReady {
				return 0
			}
		}
		return 1
	}
}

func (b *bench) describeImage() string {
	bi, err := b.strata.StrataV1beta1().BackingImages(ns).Get(context.Background(), benchImage, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("copies %s %s", bi.Status.Copies, bi.Status.Message)
}
