package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/sirupsen/logrus"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned"
)

// The REST API: the seeds' actions for users (volumes, snapshot CRs,
// snapshot quotas). Every request is authenticated (a bearer token's
// TokenReview, or a client certificate of the cluster's client CA) and the
// verb it asks for is authorized as that user on what it touches
// (SubjectAccessReview): 401 and 403 come with a JSON body naming the user,
// verb and resource. Reads come from the manager's caches; writes are made
// as rest_writes.go says.

// CallerClients makes a Strata clientset that acts with the caller's
// bearer token, so the API server judges the write as the caller's.
type CallerClients func(token string) (versioned.Interface, error)

// RESTOptions are what the REST routes need.
type RESTOptions struct {
	// Auth checks every request; nil refuses them all (503).
	Auth Auth
	// Clients acts as a caller with a bearer token; nil refuses their
	// writes (503).
	Clients CallerClients
	// Manager is the manager's own clientset: the writes of a caller with a
	// client certificate, after the caller's access review; nil refuses
	// them (503).
	Manager versioned.Interface
	// Cache answers reads (the manager's informers).
	Cache *datastore.DataStore
	// Namespace holds Strata's objects.
	Namespace string
	// NodeName is this manager's node, where revert attaches a volume;
	// DataPlane reaches its instance manager. Without them revert is 503.
	NodeName  string
	DataPlane engineapi.Connector
	// Recorder tells, on the object, what a user did through the API that
	// no controller reports (a revert); nil records nothing.
	Recorder record.EventRecorder
	Log      logrus.FieldLogger

	images BackingImages // NewHandler's, for downloads
}

// route is one path and method of the REST API; a POST with actions
// dispatches on ?action=. The OpenAPI document lists exactly these.
type route struct {
	method, path string
	actions      map[string]func(*call) error // POST ?action=<name>
	serve        func(*call) error
}

// call is one request on its way through a route.
type call struct {
	w       http.ResponseWriter
	r       *http.Request
	opts    RESTOptions
	user    user.Info
	token   string
	written bool
	// forCaller: this request writes with the manager's rights for a
	// client certificate's user (rest_writes.go).
	forCaller bool
}

// InputError is bad input: 400, naming the field and the reason.
type InputError struct{ Field, Reason string }

func (e *InputError) Error() string { return e.Field + ": " + e.Reason }

func badInput(field, format string, args ...any) error {
	return &InputError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// checkName checks the name a body gives (field "name"): a DNS-1123
// subdomain; empty only when not required (the server then generates one).
func checkName(name string, required bool) error {
	if name == "" {
		if required {
			return badInput("name", "missing")
		}
		return nil
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return badInput("name", "%q: %s", name, strings.Join(errs, "; "))
	}
	return nil
}

// parseQuantity reads a size a user wrote into field: a quantity that is
// positive, or with zeroOK not negative; example shows one.
func parseQuantity(field, s, example string, zeroOK bool) (resource.Quantity, error) {
	if s == "" {
		return resource.Quantity{}, badInput(field, "missing: give a size such as %s", example)
	}
	q, err := resource.ParseQuantity(s)
	switch {
	case err != nil:
		return q, badInput(field, "%q is not a size (a quantity such as %s)", s, example)
	case zeroOK && q.Sign() < 0:
		return q, badInput(field, "%q is negative", s)
	case !zeroOK && q.Sign() <= 0:
		return q, badInput(field, "%q is not positive", s)
	}
	return q, nil
}

// errNotFound is a 404 for something the cache does not hold.
var errNotFound = errors.New("not found")

// restRoutes is the REST API's route table.
func restRoutes() []route {
	return slices.Concat(volumeRoutes(), backupRoutes(), backingImageRoutes(), quotaRoutes(), []route{
		{method: http.MethodGet, path: "/v1/openapi.yaml", serve: serveOpenAPI},
	})
}

// registerREST adds the REST routes to mux.
func registerREST(mux *http.ServeMux, opts RESTOptions) {
	if opts.Log == nil {
		opts.Log = logrus.StandardLogger()
	}
	for _, rt := range restRoutes() {
		mux.HandleFunc(rt.method+" "+rt.path, func(w http.ResponseWriter, r *http.Request) {
			c := &call{w: w, r: r, opts: opts}
			err := c.authenticate()
			if err == nil {
				err = rt.dispatch(c)
			}
			if err != nil {
				c.fail(err)
			}
		})
	}
}

func (rt route) dispatch(c *call) error {
	if rt.actions == nil {
		return rt.serve(c)
	}
	name := c.r.URL.Query().Get("action")
	act, ok := rt.actions[name]
	if !ok {
		known := make([]string, 0, len(rt.actions))
		for a := range rt.actions {
			known = append(known, a)
		}
		slices.Sort(known)
		if name == "" {
			return badInput("action", "missing: give ?action= one of %s", strings.Join(known, ", "))
		}
		return badInput("action", "unknown action %q: one of %s", name, strings.Join(known, ", "))
	}
	return act(c)
}

func (c *call) authenticate() error {
	if c.opts.Auth == nil {
		return fmt.Errorf("%w: this manager has no way to check who calls", ErrAuthUnavailable)
	}
	u, err := c.opts.Auth.Authenticate(c.r.Context(), c.r)
	if err != nil {
		return err
	}
	c.user = u
	c.token, _ = BearerToken(c.r) // none for a client certificate's user
	return nil
}

// authorize asks whether the caller may do verb on a Strata resource.
func (c *call) authorize(verb, resource, namespace, name string) error {
	return c.opts.Auth.Authorize(c.r.Context(), c.user, authorizationv1.ResourceAttributes{
		Namespace: namespace, Verb: verb, Group: v1beta1.SchemeGroupVersion.Group,
		Version: v1beta1.SchemeGroupVersion.Version, Resource: resource, Name: name})
}

// event records, on the volume, what the caller did through the API, naming
// the caller; nothing without a Recorder or when the cache lacks the volume.
func (c *call) event(volume, reason, format string, args ...any) {
	if c.opts.Recorder == nil {
		return
	}
	v, err := volumes.cached(c, volume)
	if err != nil {
		return
	}
	c.opts.Recorder.Eventf(v, corev1.EventTypeNormal, reason, format+" by %s (REST API)", append(args, c.user.GetName())...)
}

// maxBody bounds a request's JSON body: none of them is more than a few
// fields.
const maxBody = 64 << 10

// decode reads the JSON body into v; unknown fields are refused, so a
// misspelt field is an error rather than ignored.
func (c *call) decode(v any) error {
	dec := json.NewDecoder(io.LimitReader(c.r.Body, maxBody+1))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return badInput("body", "empty: a JSON object is expected")
		}
		var field *json.UnmarshalTypeError
		if errors.As(err, &field) && field.Field != "" {
			return badInput(field.Field, "want a %s, got a JSON %s", field.Type, field.Value)
		}
		return badInput("body", "not the JSON object expected: %v", err)
	}
	return nil
}

func (c *call) reply(code int, v any) error {
	c.written = true
	if v == nil {
		c.w.WriteHeader(code)
		return nil
	}
	writeJSON(c.w, code, v)
	return nil
}

// fail writes err as the JSON error body with its status code.
func (c *call) fail(err error) {
	log := c.opts.Log.WithError(err).WithFields(logrus.Fields{"method": c.r.Method, "path": c.r.URL.Path,
		"action": c.r.URL.Query().Get("action"), "remote": c.r.RemoteAddr})
	if c.user != nil {
		log = log.WithField("user", c.user.GetName())
	}
	log.Info("REST request refused or failed")
	if c.written {
		return
	}
	var input *InputError
	var status apierrors.APIStatus
	switch {
	case errors.As(err, &input):
		writeJSON(c.w, http.StatusBadRequest, map[string]string{"error": err.Error(), "field": input.Field})
	case errors.Is(err, errNotFound):
		writeJSON(c.w, http.StatusNotFound, map[string]string{"error": err.Error()})
	case errors.Is(err, errInUse), errors.Is(err, errNotCompleted):
		writeJSON(c.w, http.StatusConflict, map[string]string{"error": err.Error()})
	case errors.As(err, &status) && status.Status().Code != 0:
		// The API server's answer to the caller's own request (RBAC,
		// admission, validation, conflicts): its code and message.
		writeJSON(c.w, int(status.Status().Code), map[string]string{"error": status.Status().Message,
			"reason": string(status.Status().Reason)})
	default:
		writeError(c.w, err)
	}
}

// ctx is the request's context.
func (c *call) ctx() context.Context { return c.r.Context() }
