package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// Uploaders: ServiceAccounts in their own namespace, as a user's would be.
// "uploader" is bound (in Strata's namespace) to a ClusterRole that may
// update backingimages; "no-upload" is bound to nothing. Their tokens come
// from the TokenRequest API, as kubectl create token gets them.
const (
	uploadNamespace  = "e2e-uploads"
	uploaderSA       = "uploader"
	deniedUploaderSA = "no-upload"
	uploaderRole     = "e2e-backingimage-uploader"
)

var uploadTokens struct {
	once            sync.Once
	allowed, denied string
	err             error
}

// uploaderToken is a token of the ServiceAccount that may upload.
func uploaderToken(t *testing.T) string {
	t.Helper()
	uploadTokens.once.Do(func() { uploadTokens.allowed, uploadTokens.denied, uploadTokens.err = makeUploaders() })
	require.NoError(t, uploadTokens.err, "the uploader ServiceAccounts")
	return uploadTokens.allowed
}

// deniedUploaderToken is a valid token of a ServiceAccount that may not.
func deniedUploaderToken(t *testing.T) string {
	t.Helper()
	uploaderToken(t)
	return uploadTokens.denied
}

func makeUploaders() (allowed, denied string, err error) {
	ctx := context.Background()
	kube := env.adminKube
	ignoreExists := func(err error) error {
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	}
	_, err = kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: uploadNamespace}}, metav1.CreateOptions{})
	if err = ignoreExists(err); err != nil {
		return "", "", err
	}
	for _, sa := range []string{uploaderSA, deniedUploaderSA} {
		_, err = kube.CoreV1().ServiceAccounts(uploadNamespace).Create(ctx,
			&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
		if err = ignoreExists(err); err != nil {
			return "", "", err
		}
	}
	_, err = kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: uploaderRole},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1beta1.SchemeGroupVersion.Group}, Resources: []string{"backingimages"},
			Verbs: []string{"get", "list", "update"}}},
	}, metav1.CreateOptions{})
	if err = ignoreExists(err); err != nil {
		return "", "", err
	}
	_, err = kube.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: uploaderRole},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: uploaderRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: uploaderSA, Namespace: uploadNamespace}},
	}, metav1.CreateOptions{})
	if err = ignoreExists(err); err != nil {
		return "", "", err
	}
	// The authorizer sees a new binding a moment later.
	user := "system:serviceaccount:" + uploadNamespace + ":" + uploaderSA
	deadline := time.Now().Add(30 * time.Second)
	for {
		sar, err := kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: "update", Group: v1beta1.SchemeGroupVersion.Group, Resource: "backingimages"}}}, metav1.CreateOptions{})
		if err == nil && sar.Status.Allowed {
			break
		}
		if time.Now().After(deadline) {
			return "", "", err
		}
		time.Sleep(200 * time.Millisecond)
	}
	token := func(sa string) (string, error) {
		ttl := int64(time.Hour.Seconds())
		tr, err := kube.CoreV1().ServiceAccounts(uploadNamespace).CreateToken(ctx, sa,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl}}, metav1.CreateOptions{})
		if err != nil {
			return "", err
		}
		return tr.Status.Token, nil
	}
	if allowed, err = token(uploaderSA); err != nil {
		return "", "", err
	}
	denied, err = token(deniedUploaderSA)
	return allowed, denied, err
}

// uploadResponse is what an upload got back.
type uploadResponse struct {
	code    int
	body    string
	header  http.Header
	elapsed time.Duration
}

// uploadWith PUTs body (size bytes; -1 unknown) to a manager's upload
// route, with Authorization: Bearer token unless token is "".
func uploadWith(t *testing.T, apiAddr, image, token string, body io.Reader, size int64) uploadResponse {
	t.Helper()
	r, err := doUpload(uploadClient(t), apiAddr, image, token, body, size)
	require.NoError(t, err)
	return r
}

// uploadClient reaches the managers' API as a user does: HTTPS, trusting
// the CA bundle Strata publishes. A client of its own per upload: a refused
// upload's connection is closed, not reused.
func uploadClient(t *testing.T) *http.Client {
	t.Helper()
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true, ExpectContinueTimeout: 30 * time.Second,
		TLSClientConfig: &tls.Config{RootCAs: caBundlePool(t), MinVersion: tls.VersionTLS12}}}
}

// doUpload is uploadWith for any goroutine. It asks to continue first
// (Expect: 100-continue, as curl -T does): a refused upload is answered
// before its body is sent.
func doUpload(client *http.Client, apiAddr, image, token string, body io.Reader, size int64) (uploadResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "https://"+apiAddr+"/v1/backingimages/"+image+"/upload", body)
	if err != nil {
		return uploadResponse{}, err
	}
	req.ContentLength = size
	req.Header.Set("Expect", "100-continue")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return uploadResponse{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return uploadResponse{code: resp.StatusCode, body: string(b), header: resp.Header, elapsed: time.Since(start)}, err
}

func jsonFields(t *testing.T, body string) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &m), "a JSON body: %s", body)
	return m
}

// Uploads need a bearer token of a user RBAC lets update the image
// (issue 24): none, or one the API server does not know, is 401 with
// WWW-Authenticate: Bearer; a valid token of a ServiceAccount without the
// permission is 403 naming the user, verb and resource; neither learns
// whether the image exists. The allowed ServiceAccount's upload is taken;
// while it runs a second upload, to the same manager or another, is 409 at
// once, its body unread, and the first one completes unharmed.
func TestUploadAuth(t *testing.T) {
	const image = "e2e-bi-upload-auth"
	raw := bytes.Repeat([]byte("strata-upload-auth-test-4MiB-raw"), (4<<20)/32) // whole 512-byte sectors
	createBackingImage(t, image, v1beta1.BackingImageSpec{SourceType: v1beta1.BackingImageSourceTypeUpload, Checksum: sha512Hex(raw)})
	waitBackingImage(t, image, time.Minute, "a UUID", func(bi *v1beta1.BackingImage) bool { return bi.Status.UUID != "" })
	mgr := env.managers["node-2"].APIAddr
	denied := "system:serviceaccount:" + uploadNamespace + ":" + deniedUploaderSA

	refusals := []struct {
		name      string
		image     string
		token     string
		wantCode  int
		wantError string
	}{
		{name: "no token", image: image, wantCode: http.StatusUnauthorized, wantError: "no Authorization header"},
		{name: "no token, an image that does not exist", image: "e2e-bi-no-such-image", wantCode: http.StatusUnauthorized,
			wantError: "no Authorization header"},
		{name: "a token the API server does not know", image: image, token: "not-a-token", wantCode: http.StatusUnauthorized,
			wantError: "the token is not valid"},
		{name: "a ServiceAccount without the permission", image: image, token: deniedUploaderToken(t), wantCode: http.StatusForbidden,
			wantError: `user "` + denied + `" may not update backingimages.strata.io "` + image + `" in namespace ` + ns},
		{name: "without the permission, an image that does not exist", image: "e2e-bi-no-such-image", token: deniedUploaderToken(t),
			wantCode: http.StatusForbidden, wantError: "may not update backingimages.strata.io"},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			r := uploadWith(t, mgr, tc.image, tc.token, bytes.NewReader(raw), int64(len(raw)))
			require.Equal(t, tc.wantCode, r.code, r.body)
			assert.Equal(t, "application/json", r.header.Get("Content-Type"))
			body := jsonFields(t, r.body)
			assert.Contains(t, body["error"], tc.wantError)
			if tc.wantCode == http.StatusUnauthorized {
				assert.Contains(t, r.header.Get("WWW-Authenticate"), "Bearer")
			} else {
				assert.Equal(t, denied, body["user"])
				assert.Equal(t, "update", body["verb"])
				assert.Equal(t, "backingimages.strata.io", body["resource"])
			}
		})
	}
	bi := getBackingImage(t, image)
	assert.Empty(t, bi.Status.FirstCopyDisk, "no refused upload reached a disk")

	// The allowed upload sends half its bytes, then waits.
	token := uploaderToken(t)
	pr, pw := io.Pipe()
	type result struct {
		uploadResponse
		err error
	}
	first := make(chan result, 1)
	client := uploadClient(t)
	go func() {
		r, err := doUpload(client, mgr, image, token, pr, int64(len(raw)))
		first <- result{r, err}
	}()
	_, err := pw.Write(raw[:len(raw)/2])
	require.NoError(t, err)
	bi = waitBackingImage(t, image, time.Minute, "receiving the upload", func(bi *v1beta1.BackingImage) bool {
		st := bi.Status.DiskFileStatusMap[bi.Status.FirstCopyDisk]
		return st != nil && st.State == v1beta1.BackingImageStateInProgress && st.Message == "receiving the upload"
	})
	firstDisk := bi.Status.FirstCopyDisk

	for _, node := range []string{"node-2", "node-1"} {
		t.Run("a second upload to "+node+" while the first runs", func(t *testing.T) {
			// Its body never comes: an answer proves none was waited for.
			never, closeNever := io.Pipe()
			defer closeNever.Close()
			r := uploadWith(t, env.managers[node].APIAddr, image, token, never, int64(len(raw)))
			require.Equal(t, http.StatusConflict, r.code, r.body)
			assert.Contains(t, jsonFields(t, r.body)["error"], "an upload of backing image "+image+" is already in progress on node node-2")
			assert.Less(t, r.elapsed, 5*time.Second, "refused at once")
		})
	}
	select {
	case r := <-first:
		t.Fatalf("the first upload ended before its body did: %d %s %v", r.code, r.body, r.err)
	default:
	}

	_, err = pw.Write(raw[len(raw)/2:])
	require.NoError(t, err)
	require.NoError(t, pw.Close())
	fr := <-first
	require.NoError(t, fr.err)
	require.Equal(t, http.StatusOK, fr.code, fr.body)
	assert.Equal(t, sha512Hex(raw), jsonFields(t, fr.body)["checksum"])
	bi = waitBackingImage(t, image, time.Minute, "first copy ready", allCopiesReady(1))
	assert.Equal(t, firstDisk, bi.Status.FirstCopyDisk, "the refused uploads took nothing from the first")
	assert.Equal(t, sha512Hex(raw), bi.Status.Checksum)

	// Once it holds its data, the image takes no other.
	r := uploadWith(t, env.managers["node-1"].APIAddr, image, token, bytes.NewReader(raw), int64(len(raw)))
	assert.Equal(t, http.StatusConflict, r.code, r.body)
	assert.Contains(t, r.body, "already holds its data")
}
