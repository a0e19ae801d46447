package api

import (
	"fmt"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned"
	"github.com/strata-storage/strata/types"
)

// Who a REST write is made as (issue 46). A caller with a bearer token:
// with that token, so the API server's RBAC, admission and audit log judge
// and record the caller. A caller with a client certificate gives the
// manager nothing it could pass on (the key stays with the caller), and
// impersonating it would need RBAC's impersonate on every user and group —
// a key to every door in the cluster for every node's manager. So such a
// write is made with the manager's own rights (Strata's objects in its
// namespace, ResourceQuotas: package/manifests/10-rbac.yaml), once the
// caller's SubjectAccessReview of that very verb and object passed: every
// route reviews before it writes. The strata.io/requested-by annotation
// and an event on the object name the caller, where the audit log names
// the manager.

// EventReasonWrittenForUser is the event of a write made with the
// manager's rights for a client certificate's user.
const EventReasonWrittenForUser = "WrittenForUser"

// strata is the clientset this request writes with: the caller's token's,
// else the manager's (forCaller then set).
func (c *call) strata() (versioned.Interface, error) {
	if c.token != "" {
		if c.opts.Clients == nil {
			return nil, fmt.Errorf("%w: this manager cannot act for users", ErrAuthUnavailable)
		}
		return c.opts.Clients(c.token)
	}
	if c.opts.Manager == nil {
		return nil, fmt.Errorf("%w: this manager cannot write for users with client certificates", ErrAuthUnavailable)
	}
	c.forCaller = true
	return c.opts.Manager, nil
}

// stamp names the caller on an object this request writes.
func (c *call) stamp(obj metav1.Object) {
	ann := obj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[types.AnnotationRequestedBy] = c.user.GetName()
	obj.SetAnnotations(ann)
}

// wrote tells that this request wrote obj (what: "created", "deleted",
// ...) when it did so with the manager's rights: a log line, and an event
// on obj when it is in Strata's namespace (the manager records events
// there only; a ResourceQuota in a user's namespace keeps the annotation).
// obj may be nil (a deleted object the cache no longer held).
func (c *call) wrote(obj datastore.Object, name, what string) {
	if !c.forCaller {
		return
	}
	c.opts.Log.WithFields(logrus.Fields{"user": c.user.GetName(), "groups": c.user.GetGroups(), "object": name,
		"path": c.r.URL.Path, "action": c.r.URL.Query().Get("action"), "write": what}).
		Info("REST write made for a client certificate's user")
	if c.opts.Recorder == nil || obj == nil || obj.GetNamespace() != c.opts.Namespace {
		return
	}
	c.opts.Recorder.Eventf(obj, corev1.EventTypeNormal, EventReasonWrittenForUser,
		"%s for %s (client certificate) through the REST API, with the manager's rights after the user's access review",
		what, c.user.GetName())
}
