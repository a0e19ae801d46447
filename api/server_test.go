package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/strata-storage/strata/internal/imagefile"
	"github.com/strata-storage/strata/types"
)

// fakeImages records the uploads that reach the controller.
type fakeImages struct {
	uploads   []string // image: body
	uploadErr error
	copyErr   error
}

func (f *fakeImages) CopyFile(image, disk, uuid string) (string, error) {
	return "", f.copyErr
}

func (f *fakeImages) Download(_ context.Context, image string, w io.Writer) error {
	if f.copyErr != nil {
		return f.copyErr
	}
	_, err := w.Write([]byte("extents of " + image))
	return err
}

func (f *fakeImages) Upload(_ context.Context, image string, body io.Reader, _ int64) (imagefile.Result, error) {
	b, err := io.ReadAll(body)
	if err != nil {
		return imagefile.Result{}, err
	}
	f.uploads = append(f.uploads, image+": "+string(b))
	return imagefile.Result{Checksum: "sum", VirtualSize: int64(len(b))}, f.uploadErr
}

func quietLog() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// Every upload is authenticated (a bearer token, a TokenReview) and
// authorized (a SubjectAccessReview of update on the image) before the
// controller sees it; each refusal has its status code and a JSON body
// that says why, and the body is never passed on.
func TestUploadAuth(t *testing.T) {
	tests := []struct {
		name       string
		header     string
		allowed    []string
		reviewErr  error
		accessErr  error
		noAuth     bool  // a handler built without Uploads
		uploadErr  error // of the controller
		wantCode   int
		wantError  string // in the JSON error
		wantFields map[string]string
		wantUpload bool
	}{
		{name: "no header", wantCode: http.StatusUnauthorized, wantError: "no Authorization header"},
		{name: "wrong scheme", header: "Basic YWxpY2U6cw==", wantCode: http.StatusUnauthorized, wantError: "not Bearer"},
		{name: "bad token", header: "Bearer bad", wantCode: http.StatusUnauthorized, wantError: "invalid bearer token"},
		{name: "denied", header: "Bearer good", wantCode: http.StatusForbidden,
			wantError: `user "system:serviceaccount:apps:alice" may not update backingimages.strata.io "img"`,
			wantFields: map[string]string{"user": alice.Username, "verb": "update", "resource": "backingimages.strata.io",
				"name": "img", "namespace": "strata-system"}},
		{name: "token review unavailable", header: "Bearer good", reviewErr: apierrors.NewTimeoutError("slow", 1),
			wantCode: http.StatusServiceUnavailable, wantError: "reviewing the token"},
		{name: "access review unavailable", header: "Bearer good", accessErr: errors.New("connection refused"),
			wantCode: http.StatusServiceUnavailable, wantError: "connection refused"},
		{name: "no authenticator: uploads refused", header: "Bearer good", noAuth: true,
			wantCode: http.StatusServiceUnavailable, wantError: "takes no uploads"},
		{name: "allowed", header: "Bearer good", allowed: []string{alice.Username}, wantCode: http.StatusOK, wantUpload: true},
		{name: "allowed, another upload running", header: "Bearer good", allowed: []string{alice.Username},
			uploadErr: fmt.Errorf("an upload of backing image img is already in progress on node node-1: %w", types.ErrImageConflict),
			wantCode:  http.StatusConflict, wantError: "already in progress", wantUpload: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			kube := newFakeKube(tc.allowed...)
			kube.reviewErr, kube.accessErr = tc.reviewErr, tc.accessErr
			images := &fakeImages{uploadErr: tc.uploadErr}
			opts := Options{Uploads: NewKubeAuth(kube), Namespace: "strata-system", Log: quietLog()}
			if tc.noAuth {
				opts.Uploads = nil
			}
			r := httptest.NewRequest(http.MethodPut, "/v1/backingimages/img/upload", strings.NewReader("bytes"))
			if tc.header != "" {
				r.Header.Set("Authorization", tc.header)
			}
			w := httptest.NewRecorder()
			NewHandler(images, opts).ServeHTTP(w, r)

			assert.Equal(t, tc.wantCode, w.Code, w.Body.String())
			assert.Equal(t, "application/json", w.Header().Get("Content-Type"))
			var body map[string]any
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &body), w.Body.String())
			if tc.wantCode == http.StatusOK {
				assert.Equal(t, "sum", body["checksum"])
			}
			if tc.wantError != "" {
				assert.Contains(t, body["error"], tc.wantError)
			} else {
				assert.NotContains(t, body, "error")
			}
			for k, v := range tc.wantFields {
				assert.Equal(t, v, body[k], k)
			}
			if tc.wantCode == http.StatusUnauthorized {
				assert.Equal(t, `Bearer realm="strata"`, w.Header().Get("WWW-Authenticate"))
			} else {
				assert.Empty(t, w.Header().Get("WWW-Authenticate"))
			}
			if tc.wantUpload {
				assert.Equal(t, []string{"img: bytes"}, images.uploads)
			} else {
				assert.Empty(t, images.uploads, "a refused upload never reaches the controller")
			}
		})
	}
}

// The peer route is open without a check, and refused (403) by one.
func TestPeerCheck(t *testing.T) {
	tests := []struct {
		name     string
		check    func(*http.Request) error
		wantCode int
	}{
		{name: "no check", wantCode: http.StatusNotFound},
		{name: "check passes", check: func(*http.Request) error { return nil }, wantCode: http.StatusNotFound},
		{name: "check refuses", check: func(*http.Request) error { return errors.New("no client certificate") }, wantCode: http.StatusForbidden},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			images := &fakeImages{copyErr: fmt.Errorf("backing image img: %w", types.ErrImageNotFound)}
			w := httptest.NewRecorder()
			NewHandler(images, Options{PeerCheck: tc.check, Log: quietLog()}).
				ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/backingimages/img/disks/d1/file?uuid=u", nil))
			assert.Equal(t, tc.wantCode, w.Code, w.Body.String())
			if tc.wantCode == http.StatusForbidden {
				assert.Contains(t, w.Body.String(), "not a peer manager: no client certificate")
			}
		})
	}
}
