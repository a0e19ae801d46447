// Package api is the manager's HTTP API: what moves a backing image's bytes
// (an upload from a user, a copy a peer manager fetches) and, later, the
// actions the seeds name. JSON errors say what is wrong; status codes say
// whether a retry can help.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/sirupsen/logrus"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/strata-storage/strata/internal/imagefile"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// BackingImages is what the API needs of the backing image controller.
type BackingImages interface {
	CopyFile(image, disk, uuid string) (string, error)
	Upload(ctx context.Context, image string, body io.Reader, size int64) (imagefile.Result, error)
	// Download writes a ready copy as an extent stream.
	Download(ctx context.Context, image string, w io.Writer) error
}

// Options are what guards the routes.
type Options struct {
	// Uploads authenticates and authorizes users' uploads: the user needs
	// update on the BackingImage (a SubjectAccessReview). nil refuses every
	// upload (503): uploads are never open to anyone by omission.
	Uploads Auth
	// Namespace is where the BackingImages live, for the access review.
	Namespace string
	// PeerCheck guards the routes peer managers call (copies between
	// disks); nil allows every caller. It sees the request (its TLS state
	// once the listener is HTTPS) and returns an error to refuse it (403).
	PeerCheck func(r *http.Request) error
	// REST configures the REST routes (api/rest.go); they are always
	// served, and refuse every request (503) without REST.Auth.
	REST RESTOptions
	Log  logrus.FieldLogger
}

// Patterns of the routes NewHandler serves beside the REST routes.
const (
	uploadRoute   = "PUT /v1/backingimages/{name}/upload"
	peerCopyRoute = "GET /v1/backingimages/{name}/disks/{disk}/file"
)

// NewHandler routes the API (every route is in api/openapi.yaml):
//
//	PUT /v1/backingimages/{name}/upload               the image's data (raw, qcow2, .gz, .xz); Authorization: Bearer <token>
//	GET /v1/backingimages/{name}/disks/{disk}/file?uuid=   a ready copy as an extent stream (peers)
//	the REST routes of api/rest.go
func NewHandler(images BackingImages, opts Options) http.Handler {
	log := opts.Log
	if log == nil {
		log = logrus.StandardLogger()
	}
	mux := http.NewServeMux()
	if opts.REST.Log == nil {
		opts.REST.Log = log
	}
	opts.REST.images = images
	registerREST(mux, opts.REST)
	mux.HandleFunc(uploadRoute, func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		// Who asks comes first: a caller who may not upload learns nothing
		// of the image, not even whether an upload is running.
		u, err := authorizeUpload(r, opts, name)
		if err != nil {
			log.WithError(err).WithFields(logrus.Fields{"backingImage": name, "remote": r.RemoteAddr}).Warn("Upload refused")
			writeError(w, err)
			return
		}
		log := log.WithFields(logrus.Fields{"backingImage": name, "user": u.GetName()})
		log.Info("Upload started")
		res, err := images.Upload(r.Context(), name, r.Body, r.ContentLength)
		if err != nil {
			log.WithError(err).Warn("Upload failed")
			writeError(w, err)
			return
		}
		log.WithField("checksum", res.Checksum).Info("Upload received")
		writeJSON(w, http.StatusOK, map[string]any{"name": name, "virtualSize": res.VirtualSize, "checksum": res.Checksum,
			"formats": res.Formats, "size": res.SourceSize})
	})
	mux.HandleFunc(peerCopyRoute, peerOnly(opts.PeerCheck, log, func(w http.ResponseWriter, r *http.Request) {
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
	}))
	return mux
}

// errUploadsNotConfigured: a handler built without upload authentication.
var errUploadsNotConfigured = errors.New("this manager takes no uploads: it has no way to check who sends them")

// authorizeUpload: the request's bearer token must name a user who may
// update the BackingImage.
func authorizeUpload(r *http.Request, opts Options, name string) (user.Info, error) {
	if opts.Uploads == nil {
		return nil, fmt.Errorf("%w: %w", errUploadsNotConfigured, ErrAuthUnavailable)
	}
	u, err := opts.Uploads.Authenticate(r.Context(), r)
	if err != nil {
		return nil, err
	}
	attrs := authorizationv1.ResourceAttributes{Namespace: opts.Namespace, Verb: "update", Group: v1beta1.SchemeGroupVersion.Group,
		Version: v1beta1.SchemeGroupVersion.Version, Resource: "backingimages", Name: name}
	if err := opts.Uploads.Authorize(r.Context(), u, attrs); err != nil {
		return nil, err
	}
	return u, nil
}

// errPeerRefused wraps what a PeerCheck refused.
var errPeerRefused = errors.New("refused: not a peer manager")

// peerOnly guards a route by check (nil: open).
func peerOnly(check func(*http.Request) error, log logrus.FieldLogger, next http.HandlerFunc) http.HandlerFunc {
	if check == nil {
		return next
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if err := check(r); err != nil {
			log.WithError(err).WithFields(logrus.Fields{"path": r.URL.Path, "remote": r.RemoteAddr}).Warn("Peer request refused")
			writeError(w, fmt.Errorf("%w: %w", errPeerRefused, err))
			return
		}
		next(w, r)
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	body := map[string]string{"error": err.Error()}
	code := http.StatusInternalServerError
	var forbidden *ForbiddenError
	switch {
	case errors.Is(err, ErrUnauthenticated):
		code = http.StatusUnauthorized
		w.Header().Set("WWW-Authenticate", `Bearer realm="strata"`)
	case errors.As(err, &forbidden):
		code = http.StatusForbidden
		body["user"], body["verb"], body["resource"] = forbidden.User, forbidden.Attrs.Verb, forbidden.Resource()
		if forbidden.Attrs.Name != "" {
			body["name"] = forbidden.Attrs.Name
		}
		if forbidden.Attrs.Namespace != "" {
			body["namespace"] = forbidden.Attrs.Namespace
		}
	case errors.Is(err, errPeerRefused):
		code = http.StatusForbidden
	case errors.Is(err, ErrAuthUnavailable):
		code = http.StatusServiceUnavailable
	case errors.Is(err, types.ErrImageNotFound):
		code = http.StatusNotFound
	case errors.Is(err, types.ErrImageConflict):
		code = http.StatusConflict
	case errors.Is(err, types.ErrImageNotReady):
		code = http.StatusServiceUnavailable
	case errors.Is(err, types.ErrImageTooLarge), errors.Is(err, imagefile.ErrLimitExceeded):
		code = http.StatusRequestEntityTooLarge
	case errors.Is(err, imagefile.ErrNotAnImage), errors.Is(err, imagefile.ErrChecksumMismatch):
		code = http.StatusUnprocessableEntity // the bytes sent are the problem, not the server
	case errors.Is(err, context.Canceled):
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, body)
}
