package auditcheck

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

// Request is what the check reads of one audited request.
type Request struct {
	User, UserAgent string
	Verb            string
	// Group, Resource, Subresource, Namespace and Name of the object; empty
	// for a non-resource request, which has NonResourceURL instead.
	Group, Resource, Subresource, Namespace, Name string
	NonResourceURL                                string
	Code                                          int32
	// Denied: the authorizer refused it (annotation
	// authorization.k8s.io/decision: forbid). An admission webhook's or a
	// quota's 403 is not a denial: RBAC allowed the request.
	Denied bool
}

// Access is a request less who made it and which object it named: what a
// role must grant for it.
func (r Request) Access() Access {
	return Access{Verb: r.Verb, Group: r.Group, Resource: r.Resource, Subresource: r.Subresource, Namespace: r.Namespace,
		NonResourceURL: r.NonResourceURL}
}

// Access is a kind of request: verb, group, resource and subresource, and
// namespace ("" for a cluster-scoped resource, or a list or watch across
// namespaces).
type Access struct {
	Verb, Group, Resource, Subresource, Namespace, NonResourceURL string
}

func (a Access) String() string {
	if a.NonResourceURL != "" {
		return a.Verb + " " + a.NonResourceURL
	}
	what := a.Resource
	if a.Subresource != "" {
		what += "/" + a.Subresource
	}
	if a.Group != "" {
		what += "." + a.Group
	}
	where := "cluster"
	if a.Namespace != "" {
		where = a.Namespace
	}
	return fmt.Sprintf("%s %s (%s)", a.Verb, what, where)
}

// Log is an audit log's requests: each counted once however many stages
// the log recorded of it (a watch is logged when it starts and when it
// ends), identical requests folded together with their number.
type Log struct {
	Events   int // lines read
	Requests map[Request]int
}

// auditEvent is the part of an audit.k8s.io/v1 Event the check reads.
type auditEvent struct {
	AuditID    string `json:"auditID"`
	Stage      string `json:"stage"`
	RequestURI string `json:"requestURI"`
	Verb       string `json:"verb"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	UserAgent string `json:"userAgent"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
		APIGroup    string `json:"apiGroup"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code    int32  `json:"code"`
		Message string `json:"message"`
	} `json:"responseStatus"`
	Annotations map[string]string `json:"annotations"`
}

const decisionAnnotation = "authorization.k8s.io/decision"

// ReadLogFile reads an audit log file (JSON lines).
func ReadLogFile(path string) (*Log, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	l, err := ReadLog(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return l, nil
}

// ReadLog reads audit events, one JSON object a line. A last line cut
// short (the API server stopped while writing it) is skipped; any other
// line that does not parse is an error.
func ReadLog(in io.Reader) (*Log, error) {
	l := &Log{Requests: map[Request]int{}}
	seen := map[string]bool{}
	r := bufio.NewReaderSize(in, 1<<20)
	for lineNo := 1; ; lineNo++ {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 {
			var e auditEvent
			if jerr := json.Unmarshal(line, &e); jerr != nil {
				if errors.Is(err, io.EOF) { // no newline: cut short
					break
				}
				return nil, fmt.Errorf("line %d: %w", lineNo, jerr)
			}
			l.Events++
			if e.AuditID == "" || !seen[e.AuditID] {
				seen[e.AuditID] = true
				l.Requests[e.request()]++
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	return l, nil
}

func (e *auditEvent) request() Request {
	r := Request{User: e.User.Username, UserAgent: e.UserAgent, Verb: e.Verb}
	if e.ObjectRef != nil {
		r.Group, r.Resource, r.Subresource = e.ObjectRef.APIGroup, e.ObjectRef.Resource, e.ObjectRef.Subresource
		r.Namespace, r.Name = e.ObjectRef.Namespace, e.ObjectRef.Name
	} else {
		r.NonResourceURL, _, _ = strings.Cut(e.RequestURI, "?")
	}
	var message string
	if e.ResponseStatus != nil {
		r.Code, message = e.ResponseStatus.Code, e.ResponseStatus.Message
	}
	switch {
	case e.Annotations[decisionAnnotation] == "forbid":
		r.Denied = true
	case r.Code != 403:
	case inHandlerDenial(&r, message):
		// Allowed at the door, refused inside: a server-side apply that
		// would create the object, checked for create.
	case e.Annotations[decisionAnnotation] == "":
		r.Denied = true
	}
	return r
}

// rbacRefusal is how RBAC words a refusal in a 403's message.
var rbacRefusal = regexp.MustCompile(`User "[^"]*" cannot (\S+) resource "([^"]+)"`)

// inHandlerDenial recognizes a 403 of the authorizer inside the request's
// handler, after the authorization filter allowed the request (whose
// decision annotation says allow): r becomes the refused access. A 403 of
// an admission webhook or a quota is not one.
func inHandlerDenial(r *Request, message string) bool {
	m := rbacRefusal.FindStringSubmatch(message)
	if m == nil {
		return false
	}
	r.Denied = true
	r.Verb = m[1]
	r.Resource, r.Subresource, _ = strings.Cut(m[2], "/")
	if r.Verb == "create" {
		r.Name = ""
	}
	return true
}
