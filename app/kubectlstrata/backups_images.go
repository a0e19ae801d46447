package kubectlstrata

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/urfave/cli/v3"
	"golang.org/x/term"

	"github.com/strata-storage/strata/internal/imagefile"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

func backupCommand() *cli.Command {
	return &cli.Command{Name: "backup", Aliases: []string{"bk"}, Usage: "list, take, delete and restore backups",
		Commands: []*cli.Command{
			{Name: "ls", Usage: "list the backups", Action: action(listBackups)},
			{Name: "create", Usage: "back a volume up to the default BackupTarget", ArgsUsage: "VOLUME [NAME]",
				Description: "kubectl strata backup create data nightly-1 --snapshot before-upgrade",
				Flags:       []cli.Flag{&cli.StringFlag{Name: "snapshot", Usage: "a snapshot of the volume (default: a new one)"}},
				Action:      action(createBackup)},
			{Name: "rm", Usage: "delete a backup", ArgsUsage: "NAME", Action: action(deleteNamed("/v1/backups/", "backup"))},
			{Name: "restore", Usage: "restore a completed backup into a new volume", ArgsUsage: "BACKUP VOLUME",
				Description: "kubectl strata backup restore nightly-1 data-restored --replicas 2",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "size", Usage: "the new volume's size (default: the backed-up volume's)"},
					&cli.IntFlag{Name: "replicas", Usage: "replica count"},
					&cli.BoolFlag{Name: "wait", Usage: "follow the restore to its end (a progress line on a terminal)"},
				}, Action: action(restoreBackup)},
		}}
}

func listBackups(ctx context.Context, s *session) error {
	return listTable(ctx, s, "GET", "/v1/backups", []string{"NAME", "VOLUME", "SNAPSHOT", "STATE", "SIZE", "AGE"},
		func(b v1beta1.Backup) []string {
			return []string{b.Name, orNone(b.Status.VolumeName), orNone(b.Status.SnapshotName), orNone(string(b.Status.State)),
				size(b.Status.Size), s.print.age(b.CreationTimestamp)}
		})
}

func createBackup(ctx context.Context, s *session) error {
	volume, err := arg(s.cmd, 0, "VOLUME")
	if err != nil {
		return err
	}
	var b v1beta1.Backup
	body := map[string]any{"volume": volume, "name": s.cmd.Args().Get(1), "snapshot": s.cmd.String("snapshot")}
	if err := s.call(ctx, "POST", "/v1/backups", body, &b); err != nil {
		return err
	}
	return s.done(b, "backup/%s of volume/%s created", b.Name, volume)
}

func restoreBackup(ctx context.Context, s *session) error {
	backup, volume, err := twoArgs(s.cmd, "BACKUP", "VOLUME")
	if err != nil {
		return err
	}
	var v v1beta1.Volume
	body := map[string]any{"name": volume, "size": s.cmd.String("size"), "numberOfReplicas": s.cmd.Int("replicas")}
	if err := s.call(ctx, "POST", "/v1/backups/"+backup+"?action=restore", body, &v); err != nil {
		return err
	}
	if err := s.done(v, "volume/%s restoring from backup/%s", v.Name, backup); err != nil || !s.cmd.Bool("wait") {
		return err
	}
	return s.waitFilled(ctx, v.Name, "restore")
}

func imageCommand() *cli.Command {
	return &cli.Command{Name: "image", Aliases: []string{"bi"}, Usage: "list, create, upload, delete and clean up backing images",
		Commands: []*cli.Command{
			{Name: "ls", Usage: "list the backing images", Action: action(listImages)},
			{Name: "create", Usage: "create a backing image from a URL, for an upload, or from a volume", ArgsUsage: "NAME",
				Description: `kubectl strata image create debian --url https://example.com/debian.qcow2
kubectl strata image create golden --upload
kubectl strata image create from-data --volume data`,
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "url", Usage: "download from this http(s) URL"},
					&cli.BoolFlag{Name: "upload", Usage: "the data comes with kubectl strata image upload"},
					&cli.StringFlag{Name: "volume", Usage: "export this volume"},
					&cli.StringFlag{Name: "checksum", Usage: "SHA-512 of the raw image"},
					&cli.IntFlag{Name: "min-copies", Usage: "disks that always keep a copy"},
				}, Action: action(createImage)},
			{Name: "upload", Usage: "send an image file (raw, qcow2, .gz, .xz) to a backing image created with --upload",
				ArgsUsage: "NAME FILE", Action: action(uploadImage)},
			{Name: "download", Usage: "write a ready copy to a file, sparse (holes are neither sent nor written)",
				ArgsUsage: "NAME FILE", Action: action(downloadImage)},
			{Name: "rm", Usage: "delete a backing image (refused while a volume uses it)", ArgsUsage: "NAME", Action: action(deleteNamed("/v1/backingimages/", "backingimage"))},
			{Name: "cleanup", Usage: "remove the copies on named disks", ArgsUsage: "NAME DISK-UUID...", Action: action(cleanupImage)},
		}}
}

func listImages(ctx context.Context, s *session) error {
	return listTable(ctx, s, "GET", "/v1/backingimages", []string{"NAME", "SOURCE", "SIZE", "COPIES", "AGE"},
		func(bi v1beta1.BackingImage) []string {
			return []string{bi.Name, string(bi.Spec.SourceType), size(bi.Status.Size), orNone(bi.Status.Copies),
				s.print.age(bi.CreationTimestamp)}
		})
}

func createImage(ctx context.Context, s *session) error {
	name, err := arg(s.cmd, 0, "NAME")
	if err != nil {
		return err
	}
	body := map[string]any{"name": name, "checksum": s.cmd.String("checksum"), "minNumberOfCopies": s.cmd.Int("min-copies")}
	switch {
	case s.cmd.String("url") != "":
		body["sourceType"], body["url"] = "download", s.cmd.String("url")
	case s.cmd.Bool("upload"):
		body["sourceType"] = "upload"
	case s.cmd.String("volume") != "":
		body["sourceType"], body["volume"] = "export-from-volume", s.cmd.String("volume")
	default:
		return fmt.Errorf("give --url, --upload or --volume: where the image comes from")
	}
	var bi v1beta1.BackingImage
	if err := s.call(ctx, "POST", "/v1/backingimages", body, &bi); err != nil {
		return err
	}
	return s.done(bi, "backingimage/%s created", name)
}

func cleanupImage(ctx context.Context, s *session) error {
	name, err := arg(s.cmd, 0, "NAME")
	if err != nil {
		return err
	}
	disks := s.cmd.Args().Slice()[1:] // at least one: checkArgs reads DISK-UUID... in the usage
	if err := s.call(ctx, "POST", "/v1/backingimages/"+name+"?action=backingImageCleanup", map[string]any{"disks": disks}, nil); err != nil {
		return err
	}
	return s.done(nil, "backingimage/%s: copies on %d disk(s) removed", name, len(disks))
}

// uploadImage PUTs the file, with a progress line on a terminal.
func uploadImage(ctx context.Context, s *session) error {
	name, path, err := twoArgs(s.cmd, "NAME", "FILE")
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	var reply struct {
		Checksum    string `json:"checksum"`
		VirtualSize int64  `json:"virtualSize"`
	}
	// A just-created image answers 503 until its manager has set it up:
	// the upload is tried again from the start for a while.
	deadline := time.Now().Add(uploadNotReadyWait)
	for {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		err = s.uploadOnce(ctx, name, f, st.Size(), &reply)
		var apiErr *apiError
		if !errors.As(err, &apiErr) || apiErr.Code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	if err != nil {
		return err
	}
	return s.done(reply, "backingimage/%s: %s uploaded, %s of raw image, sha512 %s", name,
		size(st.Size()), size(reply.VirtualSize), reply.Checksum)
}

// downloadImage writes the image's extent stream to a sparse file; the
// file appears only once the whole stream arrived.
func downloadImage(ctx context.Context, s *session) error {
	name, path, err := twoArgs(s.cmd, "NAME", "FILE")
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.base+"/v1/backingimages/"+name+"/download", nil)
	if err != nil {
		return err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return decodeReply(resp, nil)
	}
	var total atomic.Int64
	body := &countingReader{r: resp.Body}
	stop := progressOf(func() (int64, int64) { return body.n.Load(), total.Load() }, "downloaded")
	err = imagefile.ReadExtents(ctx, body, path, func(_, size int64) { total.Store(size) })
	stop()
	if err != nil {
		return fmt.Errorf("downloading backingimage/%s: %w", name, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	return s.line("backingimage/%s: %s written to %s (%s received)", name, size(st.Size()), path, size(body.n.Load()))
}

// uploadNotReadyWait bounds the retries of an upload the API answers 503.
const uploadNotReadyWait = 30 * time.Second

func (s *session) uploadOnce(ctx context.Context, name string, f io.Reader, size int64, reply any) error {
	body := &countingReader{r: f}
	stop := progress(body, size, "uploaded")
	defer stop()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, s.base+"/v1/backingimages/"+name+"/upload", body)
	if err != nil {
		return err
	}
	req.ContentLength = size
	return s.do(req, reply)
}

// countingReader counts what was read through it.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// progress redraws "<verb> X of Y (P%)" on stderr twice a second while
// stderr is a terminal; otherwise it prints nothing (the result line says
// it all). The returned func ends it.
func progress(c *countingReader, total int64, verb string) func() {
	return progressOf(func() (int64, int64) { return c.n.Load(), total }, verb)
}

// progressOf is progress with done and total read from now.
func progressOf(now func() (done, total int64), verb string) func() {
	if !term.IsTerminal(int(os.Stderr.Fd())) {
		return func() {}
	}
	stop := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			n, total := now()
			pct := 100.0
			if total > 0 {
				pct = float64(n) * 100 / float64(total)
			}
			fmt.Fprintf(os.Stderr, "\r%s %s of %s (%.0f%%)  ", verb, size(n), size(total), pct)
			select {
			case <-stop:
				fmt.Fprintln(os.Stderr)
				return
			case <-tick.C:
			}
		}
	}()
	return func() { close(stop); <-finished }
}
