package api

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/strata-storage/strata/internal/accessreview"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	x509request "k8s.io/apiserver/pkg/authentication/request/x509"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/kubernetes"
)

// Who a request comes from and what it may do. The API asks the
// Kubernetes API server, as kube-rbac-proxy does: a bearer token is
// checked with a TokenReview, the user it names with a SubjectAccessReview,
// so RBAC (a Role granting update on backingimages) decides who may upload.
//
// Errors: ErrUnauthenticated (401: no usable token), *ForbiddenError (403)
// and ErrAuthUnavailable (503: the API server could not answer; retry).
var (
	ErrUnauthenticated = errors.New("unauthenticated")
	ErrAuthUnavailable = errors.New("authentication or authorization unavailable")
)

// Authenticator says who sent a request.
type Authenticator interface {
	Authenticate(ctx context.Context, r *http.Request) (user.Info, error)
}

// Authorizer says whether a user may do what attrs describe: nil, a
// *ForbiddenError, or an ErrAuthUnavailable error.
type Authorizer interface {
	Authorize(ctx context.Context, u user.Info, attrs authorizationv1.ResourceAttributes) error
}

// Auth is both: what a route that acts for a user needs.
type Auth interface {
	Authenticator
	Authorizer
}

// ForbiddenError is a user denied an action; it names both.
type ForbiddenError struct {
	User  string
	Attrs authorizationv1.ResourceAttributes
	// Path is set instead of Attrs' resource for a non-resource URL
	// (/metrics); Attrs.Verb is the verb either way.
	Path   string
	Reason string // the authorizer's, may be empty
}

// Resource is the resource as RBAC names it: resource[/subresource][.group],
// or the non-resource path.
func (e *ForbiddenError) Resource() string {
	if e.Path != "" {
		return e.Path
	}
	r := e.Attrs.Resource
	if e.Attrs.Subresource != "" {
		r += "/" + e.Attrs.Subresource
	}
	if e.Attrs.Group != "" {
		r += "." + e.Attrs.Group
	}
	return r
}

func (e *ForbiddenError) Error() string {
	msg := fmt.Sprintf("user %q may not %s %s", e.User, e.Attrs.Verb, e.Resource())
	if e.Attrs.Name != "" {
		msg += fmt.Sprintf(" %q", e.Attrs.Name)
	}
	if e.Attrs.Namespace != "" {
		msg += " in namespace " + e.Attrs.Namespace
	}
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	return msg
}

// KubeAuth authenticates bearer tokens with TokenReviews and authorizes
// with SubjectAccessReviews. The client's identity needs create on
// tokenreviews and subjectaccessreviews (package/manifests/10-rbac.yaml).
type KubeAuth struct {
	client kubernetes.Interface
	// Audiences the token must be meant for; nil: the API server's own
	// (what kubectl create token gives by default).
	Audiences []string
	tokens    *tokenCache
	certs     *x509request.Authenticator // WithClientCertificates'; nil: tokens only
}

// Positive TokenReview answers are kept briefly (a client sending many
// requests costs one review per tokenCacheTTL); a revoked token works at
// most that much longer. Refusals are never kept.
const (
	tokenCacheTTL  = 10 * time.Second
	tokenCacheSize = 1024
)

func NewKubeAuth(client kubernetes.Interface) *KubeAuth {
	return &KubeAuth{client: client, tokens: newTokenCache(tokenCacheTTL, tokenCacheSize, time.Now)}
}

// BearerToken is the token of the request's Authorization header.
func BearerToken(r *http.Request) (string, error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return "", fmt.Errorf("no Authorization header: send Authorization: Bearer <token> (e.g. from kubectl create token <serviceaccount>): %w",
			ErrUnauthenticated)
	}
	scheme, token, _ := strings.Cut(h, " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", fmt.Errorf("the Authorization header's scheme is %q, not Bearer: %w", scheme, ErrUnauthenticated)
	}
	token = strings.TrimSpace(token)
	if token == "" || strings.ContainsAny(token, " \t") {
		return "", fmt.Errorf("the Authorization header holds no single bearer token: %w", ErrUnauthenticated)
	}
	return token, nil
}

// Authenticate is the user of r's bearer token or, when r has no
// Authorization header, of its client certificate (WithClientCertificates).
func (a *KubeAuth) Authenticate(ctx context.Context, r *http.Request) (user.Info, error) {
	if r.Header.Get("Authorization") == "" {
		if u, presented, err := a.authenticateCertificate(r); presented {
			return u, err
		}
	}
	token, err := BearerToken(r)
	if err != nil {
		return nil, err
	}
	key := sha256.Sum256([]byte(token))
	if u, ok := a.tokens.get(key); ok {
		return u, nil
	}
	tr, err := a.client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: a.Audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("reviewing the token: %v: %w", err, ErrAuthUnavailable)
	}
	if !tr.Status.Authenticated {
		// The review's error may say why (expired, unknown signer); it is
		// the caller's own token, so it is no secret from them.
		why := "the token is not valid"
		if tr.Status.Error != "" {
			why += ": " + tr.Status.Error
		}
		return nil, fmt.Errorf("%s: %w", why, ErrUnauthenticated)
	}
	u := &user.DefaultInfo{Name: tr.Status.User.Username, UID: tr.Status.User.UID, Groups: tr.Status.User.Groups}
	if len(tr.Status.User.Extra) > 0 {
		u.Extra = make(map[string][]string, len(tr.Status.User.Extra))
		for k, v := range tr.Status.User.Extra {
			u.Extra[k] = v
		}
	}
	a.tokens.put(key, u)
	return u, nil
}

func (a *KubeAuth) Authorize(ctx context.Context, u user.Info, attrs authorizationv1.ResourceAttributes) error {
	return a.review(ctx, u, authorizationv1.SubjectAccessReviewSpec{ResourceAttributes: &attrs},
		&ForbiddenError{User: u.GetName(), Attrs: attrs})
}

// AuthorizeNonResource asks whether the user may use verb on a
// non-resource path, as RBAC's nonResourceURLs grant it (/metrics).
func (a *KubeAuth) AuthorizeNonResource(ctx context.Context, u user.Info, path, verb string) error {
	return a.review(ctx, u, authorizationv1.SubjectAccessReviewSpec{
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: verb}},
		&ForbiddenError{User: u.GetName(), Attrs: authorizationv1.ResourceAttributes{Verb: verb}, Path: path})
}

// review runs a SubjectAccessReview of spec as u; denied is the error of
// a refusal, its Reason filled in.
func (a *KubeAuth) review(ctx context.Context, u user.Info, spec authorizationv1.SubjectAccessReviewSpec, denied *ForbiddenError) error {
	sar := accessreview.For(u.GetName(), u.GetUID(), u.GetGroups(), u.GetExtra(), spec)
	res, err := a.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("reviewing the access of %q: %v: %w", u.GetName(), err, ErrAuthUnavailable)
	}
	if res.Status.Allowed && !res.Status.Denied {
		return nil
	}
	denied.Reason = res.Status.Reason
	if res.Status.EvaluationError != "" {
		denied.Reason = strings.TrimPrefix(strings.Join([]string{denied.Reason, res.Status.EvaluationError}, "; "), "; ")
	}
	return denied
}

// tokenCache holds users of tokens a TokenReview accepted, by the token's
// SHA-256, for ttl; at most size of them.
type tokenCache struct {
	mu      sync.Mutex
	ttl     time.Duration
	size    int
	now     func() time.Time
	entries map[[sha256.Size]byte]tokenEntry
}

type tokenEntry struct {
	user    user.Info
	expires time.Time
}

func newTokenCache(ttl time.Duration, size int, now func() time.Time) *tokenCache {
	return &tokenCache{ttl: ttl, size: size, now: now, entries: map[[sha256.Size]byte]tokenEntry{}}
}

func (c *tokenCache) get(key [sha256.Size]byte) (user.Info, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok {
		return nil, false
	}
	if !c.now().Before(e.expires) {
		delete(c.entries, key)
		return nil, false
	}
	return e.user, true
}

func (c *tokenCache) put(key [sha256.Size]byte, u user.Info) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if len(c.entries) >= c.size {
		for k, e := range c.entries {
			if !now.Before(e.expires) {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= c.size {
			return // full of live entries: this one is reviewed each time
		}
	}
	c.entries[key] = tokenEntry{user: u, expires: now.Add(c.ttl)}
}
