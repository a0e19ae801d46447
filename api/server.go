// Package api is the manager's HTTP API: what moves a backing image's bytes
// (an upload from a user, a copy a peer manager fetches) and, later, the
// actions the seeds name. JSON errors say what is wrong; status codes say
// whether a retry can help.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/controller"
	"github.com/strata-storage/strata/internal/imagefile"
)

// BackingImages is what the API needs of the backing image controller.
type BackingImages interface {
	CopyFile(image, disk, uuid string) (string, error)
	Upload(ctx context.Context, image string, body io.Reader, size int64) (imagefile.Result, error)
}

// NewHandler routes the API:
//
//	PUT /v1/backingimages/{name}/upload               the image's data (raw, qcow2, .gz, .xz)
//	GET /v1/backingimages/{name}/disks/{disk}/file?uuid=   a ready copy as an extent stream (peers)
func NewHandler(images BackingImages, log logrus.FieldLogger) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/backingimages/{name}/upload", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		res, err := images.Upload(r.Context(), name, r.Body, r.ContentLength)
		if err != nil {
			log.WithError(err).WithField("backingImage", name).Warn("Upload failed")
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"name": name, "virtualSize": res.VirtualSize, "checksum": res.Checksum,
			"formats": res.Formats, "size": res.SourceSize})
	})
	mux.HandleFunc("GET /v1/backingimages/{name}/disks/{disk}/file", func(w http.ResponseWriter, r *http.Request) {
		path, err := images.CopyFile(r.PathValue("name"), r.PathValue("disk"), r.URL.Query().Get("uuid"))
		if err != nil {
			writeError(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		if err := imagefile.WriteExtents(r.Context(), w, path); err != nil {
			// Headers are gone; the missing end mark tells the peer.
			log.WithError(err).WithField("file", path).Warn("Serving a backing image copy failed")
		}
	})
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, controller.ErrImageNotFound):
		code = http.StatusNotFound
	case errors.Is(err, controller.ErrImageConflict):
		code = http.StatusConflict
	case errors.Is(err, controller.ErrImageNotReady):
		code = http.StatusServiceUnavailable
	case errors.Is(err, controller.ErrImageTooLarge), errors.Is(err, imagefile.ErrLimitExceeded):
		code = http.StatusRequestEntityTooLarge
	case errors.Is(err, imagefile.ErrNotAnImage), errors.Is(err, imagefile.ErrChecksumMismatch):
		code = http.StatusUnprocessableEntity // the bytes sent are the problem, not the server
	case errors.Is(err, context.Canceled):
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, map[string]string{"error": err.Error()})
}
