package api

import (
	"context"
	"net/http"

	"github.com/sirupsen/logrus"
	"k8s.io/apiserver/pkg/authentication/user"
)

// NonResourceAuth checks users against RBAC's nonResourceURLs (KubeAuth).
type NonResourceAuth interface {
	Authenticator
	AuthorizeNonResource(ctx context.Context, u user.Info, path, verb string) error
}

// RequireNonResource lets through to next only the requests whose bearer
// token names a user who may use verb on path — how the Kubernetes
// components guard their own /metrics (a Role with nonResourceURLs:
// ["/metrics"], verbs: ["get"]). Refusals are 401 or 403 with a JSON body.
func RequireNonResource(auth NonResourceAuth, path, verb string, next http.Handler, log logrus.FieldLogger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, err := auth.Authenticate(r.Context(), r)
		if err == nil {
			err = auth.AuthorizeNonResource(r.Context(), u, path, verb)
		}
		if err != nil {
			log.WithError(err).WithFields(logrus.Fields{"path": r.URL.Path, "remote": r.RemoteAddr}).Info("Refused")
			writeError(w, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}
