package api

import (
	"context"
	"crypto/sha256"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/authentication/user"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// fakeKube is an API server that knows one token ("good", naming alice)
// and lets the users in allowed update backingimages; calls count.
type fakeKube struct {
	*kubefake.Clientset
	allowed      map[string]bool
	reviewErr    error // TokenReview create fails
	accessErr    error // SubjectAccessReview create fails
	tokenReviews int
	lastSAR      *authorizationv1.SubjectAccessReview
	// verbs, when set, are the only verbs an allowed user may use.
	verbs map[string]bool
}

var alice = authenticationv1.UserInfo{Username: "system:serviceaccount:apps:alice", UID: "uid-alice",
	Groups: []string{"system:serviceaccounts", "system:serviceaccounts:apps", "system:authenticated"},
	Extra:  map[string]authenticationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"uploader"}}}

func newFakeKube(allowed ...string) *fakeKube {
	f := &fakeKube{Clientset: kubefake.NewClientset(), allowed: map[string]bool{}}
	for _, u := range allowed {
		f.allowed[u] = true
	}
	f.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		f.tokenReviews++
		if f.reviewErr != nil {
			return true, nil, f.reviewErr
		}
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).DeepCopy()
		if tr.Spec.Token == "good" {
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: alice}
		} else {
			tr.Status = authenticationv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		return true, tr, nil
	})
	f.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if f.accessErr != nil {
			return true, nil, f.accessErr
		}
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview).DeepCopy()
		f.lastSAR = sar.DeepCopy()
		verb := ""
		if a := sar.Spec.ResourceAttributes; a != nil {
			verb = a.Verb
		}
		if f.allowed[sar.Spec.User] && (f.verbs == nil || f.verbs[verb]) {
			sar.Status = authorizationv1.SubjectAccessReviewStatus{Allowed: true, Reason: "RBAC: allowed by RoleBinding"}
		} else {
			sar.Status = authorizationv1.SubjectAccessReviewStatus{Reason: "no RBAC policy matched"}
		}
		return true, sar, nil
	})
	return f
}

var updateImg = authorizationv1.ResourceAttributes{Namespace: "strata-system", Verb: "update", Group: "strata.io",
	Version: "v1beta1", Resource: "backingimages", Name: "img"}

func requestWith(header string) *http.Request {
	r := httptest.NewRequest(http.MethodPut, "/v1/backingimages/img/upload", nil)
	if header != "" {
		r.Header.Set("Authorization", header)
	}
	return r
}

// The authenticator and authorizer on their own: each answer of the API
// server becomes the error class the handler maps to a status code, and
// the access review carries the whole user the token review named.
func TestKubeAuth(t *testing.T) {
	unavailable := apierrors.NewServiceUnavailable("etcd is down")
	tests := []struct {
		name      string
		header    string
		allowed   []string
		reviewErr error
		accessErr error
		wantErr   error  // of Authenticate, else of Authorize
		wantMsg   string // in the error
		forbidden bool
	}{
		{name: "no header", wantErr: ErrUnauthenticated, wantMsg: "no Authorization header"},
		{name: "wrong scheme", header: "Basic YWxpY2U6cw==", wantErr: ErrUnauthenticated, wantMsg: `scheme is "Basic", not Bearer`},
		{name: "empty token", header: "Bearer ", wantErr: ErrUnauthenticated, wantMsg: "no single bearer token"},
		{name: "bad token", header: "Bearer bad", wantErr: ErrUnauthenticated, wantMsg: "the token is not valid: invalid bearer token"},
		{name: "token review fails", header: "Bearer good", reviewErr: unavailable, wantErr: ErrAuthUnavailable, wantMsg: "etcd is down"},
		{name: "denied", header: "Bearer good", forbidden: true,
			wantMsg: `user "system:serviceaccount:apps:alice" may not update backingimages.strata.io "img" in namespace strata-system: no RBAC policy matched`},
		{name: "access review fails", header: "Bearer good", allowed: []string{alice.Username}, accessErr: unavailable,
			wantErr: ErrAuthUnavailable, wantMsg: "etcd is down"},
		{name: "allowed", header: "bearer good", allowed: []string{alice.Username}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			kube := newFakeKube(tc.allowed...)
			kube.reviewErr, kube.accessErr = tc.reviewErr, tc.accessErr
			a := NewKubeAuth(kube)
			ctx := context.Background()
			u, err := a.Authenticate(ctx, requestWith(tc.header))
			if err == nil {
				assert.Equal(t, alice.Username, u.GetName())
				err = a.Authorize(ctx, u, updateImg)
			}
			switch {
			case tc.forbidden:
				var fe *ForbiddenError
				require.ErrorAs(t, err, &fe)
				assert.Equal(t, tc.wantMsg, fe.Error())
			case tc.wantErr != nil:
				require.ErrorIs(t, err, tc.wantErr)
				assert.Contains(t, err.Error(), tc.wantMsg)
			default:
				require.NoError(t, err)
			}
			if kube.lastSAR != nil {
				spec := kube.lastSAR.Spec
				assert.Equal(t, &updateImg, spec.ResourceAttributes)
				assert.Equal(t, alice.Username, spec.User)
				assert.Equal(t, alice.UID, spec.UID)
				assert.Equal(t, alice.Groups, spec.Groups)
				assert.Equal(t, map[string]authorizationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"uploader"}}, spec.Extra)
			}
		})
	}
}

// An accepted token is asked about once per TTL; a refused one every time.
func TestKubeAuthCachesAcceptedTokens(t *testing.T) {
	kube := newFakeKube()
	now := time.Now()
	a := NewKubeAuth(kube)
	a.tokens = newTokenCache(10*time.Second, 2, func() time.Time { return now })
	ctx := context.Background()
	for range 3 {
		_, err := a.Authenticate(ctx, requestWith("Bearer good"))
		require.NoError(t, err)
	}
	assert.Equal(t, 1, kube.tokenReviews, "accepted once, then from the cache")
	for range 2 {
		_, err := a.Authenticate(ctx, requestWith("Bearer bad"))
		require.ErrorIs(t, err, ErrUnauthenticated)
	}
	assert.Equal(t, 3, kube.tokenReviews, "a refusal is not kept")
	now = now.Add(10 * time.Second)
	_, err := a.Authenticate(ctx, requestWith("Bearer good"))
	require.NoError(t, err)
	assert.Equal(t, 4, kube.tokenReviews, "reviewed again after the TTL")
}

func TestTokenCacheBounded(t *testing.T) {
	now := time.Now()
	c := newTokenCache(time.Second, 2, func() time.Time { return now })
	key := func(s string) [sha256.Size]byte { return sha256.Sum256([]byte(s)) }
	u := &user.DefaultInfo{Name: "u"}
	c.put(key("a"), u)
	c.put(key("b"), u)
	c.put(key("c"), u) // full of live entries: not kept
	_, ok := c.get(key("c"))
	assert.False(t, ok)
	_, ok = c.get(key("a"))
	assert.True(t, ok)
	now = now.Add(time.Second)
	c.put(key("c"), u) // the expired ones make room
	_, ok = c.get(key("c"))
	assert.True(t, ok)
	assert.Len(t, c.entries, 1)
}

// /metrics is served to a user RBAC lets get it, and to no one else.
func TestRequireNonResource(t *testing.T) {
	tests := []struct {
		name     string
		header   string
		allowed  []string
		wantCode int
		wantBody string
	}{
		{name: "no token", wantCode: http.StatusUnauthorized, wantBody: "no Authorization header"},
		{name: "not allowed", header: "Bearer good", wantCode: http.StatusForbidden,
			wantBody: `user \"system:serviceaccount:apps:alice\" may not get /metrics`},
		{name: "allowed", header: "Bearer good", allowed: []string{alice.Username}, wantCode: http.StatusOK, wantBody: "series"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			kube := newFakeKube(tc.allowed...)
			next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("series")) })
			r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
			if tc.header != "" {
				r.Header.Set("Authorization", tc.header)
			}
			w := httptest.NewRecorder()
			RequireNonResource(NewKubeAuth(kube), "/metrics", "get", next, quietLog()).ServeHTTP(w, r)
			assert.Equal(t, tc.wantCode, w.Code)
			assert.Contains(t, w.Body.String(), tc.wantBody)
			if kube.lastSAR != nil {
				assert.Equal(t, &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"}, kube.lastSAR.Spec.NonResourceAttributes)
			}
		})
	}
}
