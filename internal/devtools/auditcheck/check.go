package auditcheck

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
)

// Component is one identity whose RBAC is held against its requests.
type Component struct {
	Name                      string // as reported, e.g. strata-manager
	Namespace, ServiceAccount string
}

// User is the component's user name in the audit log.
func (c Component) User() string { return ServiceAccountUser(c.Namespace, c.ServiceAccount) }

// Allowance excuses one finding, with the reason in a line.
type Allowance struct {
	Component string
	// Verb, Group and Resource (with "/subresource") as the grant or the
	// request has them; "*" in a grant is matched as written.
	Verb, Group, Resource string
	// Name, for a denial: the object's; "" matches any.
	Name   string
	Reason string
}

func (a Allowance) String() string {
	s := fmt.Sprintf("%s: %s %s", a.Component, a.Verb, a.Resource)
	if a.Group != "" {
		s += "." + a.Group
	}
	if a.Name != "" {
		s += " " + a.Name
	}
	return s
}

// Config says whose requests count and what is excused.
type Config struct {
	Components []Component
	// IgnoreUserAgents are user-agent prefixes of clients that borrow a
	// component's token (a test probing what the component may do): their
	// requests are not the component's.
	IgnoreUserAgents []string
	// Unused excuses grants no request used: rarely exercised ones.
	Unused []Allowance
	// Broad excuses wildcard grants.
	Broad []Allowance
	// Denied excuses denials a test causes on purpose.
	Denied []Allowance
	// PartialRun: the log is of part of the flows (a filtered test run),
	// so an unused grant says nothing: only denials, wildcards and broken
	// allowances fail; unused grants are counted, not listed as failures.
	PartialRun bool
}

// Report is the outcome of Check.
type Report struct {
	Events     int // audit log lines
	Requests   int // distinct requests (by audit ID)
	Components []ComponentReport
	// Failures make the check fail: denials, unused grants and wildcards
	// not excused, allowances that excuse nothing the manifests grant.
	Failures []string
	// Notes do not: allowances that were not needed this time, requests
	// allowed by a binding outside the manifests.
	Notes []string
}

// ComponentReport is one component's figures.
type ComponentReport struct {
	Component
	Requests int // requests of the component counted
	Ignored  int // requests under its name from ignored user agents
	// Used are the distinct accesses it was allowed, with how many requests each.
	Used map[Access]int
	// UserAgents are the clients (user agent up to the first '/') the
	// requests came from, with how many each.
	UserAgents map[string]int
	Granted    []Grant
	Unused     []Grant // granted, used by no request (excused or not)
	// UnusedExcused is how many of Unused an allowance excuses.
	UnusedExcused int
	Denied        map[Request]int
	// Elsewhere are accesses allowed but granted by no rule of the
	// manifests for this component: a default role of the API server
	// (discovery, self reviews) or a binding made outside them.
	Elsewhere map[Access]int
}

// UsedResourceVerbs counts the distinct (group, resource, verb) granted
// that some request used (a list an informer's watch stood for included);
// namespaces and names folded, NonResourceURLs left out.
func (c ComponentReport) UsedResourceVerbs() int {
	unused := map[string]bool{}
	for _, g := range c.Unused {
		unused[g.String()] = true
	}
	set := map[[3]string]bool{}
	for _, g := range c.Granted {
		if g.NonResourceURL == "" && !unused[g.String()] {
			set[[3]string{g.Group, g.Resource, g.Verb}] = true
		}
	}
	return len(set)
}

// RequestedAccesses counts the distinct accesses the component was
// allowed (verb, group, resource, namespace).
func (c ComponentReport) RequestedAccesses() int { return len(c.Used) }

// GrantedResourceVerbs counts the distinct (group, resource, verb) granted.
func (c ComponentReport) GrantedResourceVerbs() int {
	set := map[[3]string]bool{}
	for _, g := range c.Granted {
		if g.NonResourceURL == "" {
			set[[3]string{g.Group, g.Resource, g.Verb}] = true
		}
	}
	return len(set)
}

// Failed says whether anything is wrong.
func (r *Report) Failed() bool { return len(r.Failures) > 0 }

// Check holds each component's grants in rbac against its requests in log.
func Check(rbac *RBAC, log *Log, cfg Config) (*Report, error) {
	rep := &Report{Events: log.Events, Requests: len(log.Requests)}
	byUser := map[string]*ComponentReport{}
	for _, c := range cfg.Components {
		if !slices.Contains(rbac.ServiceAccounts, c.Namespace+"/"+c.ServiceAccount) {
			return nil, fmt.Errorf("component %s: ServiceAccount %s/%s is not in the manifests", c.Name, c.Namespace, c.ServiceAccount)
		}
		grants, err := rbac.GrantsOf(c.Namespace, c.ServiceAccount)
		if err != nil {
			return nil, err
		}
		cr := &ComponentReport{Component: c, Granted: grants, Used: map[Access]int{}, UserAgents: map[string]int{},
			Denied: map[Request]int{}, Elsewhere: map[Access]int{}}
		rep.Components = append(rep.Components, *cr)
		byUser[c.User()] = cr
	}
	used := map[*ComponentReport][]bool{}
	for cr := range maps.Values(byUser) {
		used[cr] = make([]bool, len(cr.Granted))
	}
	for req, n := range log.Requests {
		cr := byUser[req.User]
		if cr == nil {
			continue
		}
		if slices.ContainsFunc(cfg.IgnoreUserAgents, func(p string) bool { return strings.HasPrefix(req.UserAgent, p) }) {
			cr.Ignored += n
			continue
		}
		cr.Requests += n
		agent, _, _ := strings.Cut(req.UserAgent, "/")
		cr.UserAgents[agent] += n
		if req.Denied {
			cr.Denied[req] += n
			continue
		}
		covered := false
		for i, g := range cr.Granted {
			if g.Covers(req) {
				used[cr][i] = true
				covered = true
			}
			for _, implied := range impliedRequests(req) {
				if g.Covers(implied) {
					used[cr][i] = true
				}
			}
		}
		if covered {
			cr.Used[req.Access()] += n
		} else {
			cr.Elsewhere[req.Access()] += n
		}
	}

	allowances := map[string]map[Allowance]bool{"unused": {}, "broad": {}, "denied": {}}
	for i := range rep.Components {
		cr := byUser[rep.Components[i].User()]
		for j, g := range cr.Granted {
			if g.Wildcard() {
				if a, ok := excuse(cfg.Broad, cr.Name, g.Verb, g.Group, g.Resource, ""); ok {
					allowances["broad"][a] = true
				} else {
					rep.Failures = append(rep.Failures, fmt.Sprintf("%s: too broad: %s grants %s; name the resources and verbs",
						cr.Name, g.Role, g))
				}
			}
			if used[cr][j] {
				continue
			}
			cr.Unused = append(cr.Unused, g)
			if a, ok := excuse(cfg.Unused, cr.Name, g.Verb, g.Group, g.Resource, ""); ok {
				allowances["unused"][a] = true
				cr.UnusedExcused++
				continue
			}
			if cfg.PartialRun {
				continue
			}
			rep.Failures = append(rep.Failures, fmt.Sprintf("%s: granted but unused: %s", cr.Name, g))
		}
		for _, req := range sortedRequests(cr.Denied) {
			res := req.Resource
			if req.Subresource != "" {
				res += "/" + req.Subresource
			}
			if a, ok := excuse(cfg.Denied, cr.Name, req.Verb, req.Group, res, req.Name); ok {
				allowances["denied"][a] = true
				continue
			}
			rep.Failures = append(rep.Failures, fmt.Sprintf("%s: denied %d time(s): %s, name %q, by %s",
				cr.Name, cr.Denied[req], req.Access(), req.Name, req.UserAgent))
		}
		for _, a := range sortedAccesses(cr.Elsewhere) {
			if a.NonResourceURL == "" {
				rep.Notes = append(rep.Notes, fmt.Sprintf("%s: allowed by no rule of the manifests (a default role?): %s, %d time(s)",
					cr.Name, a, cr.Elsewhere[a]))
			}
		}
		rep.Components[i] = *cr
	}

	// An allowance must excuse something the manifests grant (or, for a
	// denial, something that can happen); one not needed this run is a note.
	for kind, list := range map[string][]Allowance{"unused": cfg.Unused, "broad": cfg.Broad, "denied": cfg.Denied} {
		for _, a := range list {
			if allowances[kind][a] {
				continue
			}
			cr := byUser[userOf(cfg.Components, a.Component)]
			if cr == nil {
				rep.Failures = append(rep.Failures, fmt.Sprintf("allowance (%s) %s: no such component", kind, a))
				continue
			}
			if kind != "denied" && !slices.ContainsFunc(cr.Granted, func(g Grant) bool {
				return g.Verb == a.Verb && g.Group == a.Group && g.Resource == a.Resource
			}) {
				rep.Failures = append(rep.Failures, fmt.Sprintf("allowance (%s) %s: the manifests grant no such thing; remove it", kind, a))
				continue
			}
			if !cfg.PartialRun {
				rep.Notes = append(rep.Notes, fmt.Sprintf("allowance (%s) %s: not needed this run", kind, a))
			}
		}
	}
	sort.Strings(rep.Failures)
	sort.Strings(rep.Notes)
	return rep, nil
}

// impliedRequests are what a request also needs granted though the audit
// log names one verb:
//   - a watch also uses list: client-go's informers list with a streaming
//     watch (WatchList) where the API server offers it, as this one does,
//     and fall back to a plain list where it does not;
//   - a patch answered 201 Created (a server-side apply of an object that
//     did not exist) was also authorized for create, inside the handler.
func impliedRequests(r Request) []Request {
	switch {
	case r.Verb == "watch":
		l := r
		l.Verb = "list"
		return []Request{l}
	case r.Verb == "patch" && r.Code == 201:
		c := r
		c.Verb, c.Name = "create", ""
		return []Request{c}
	}
	return nil
}

func userOf(components []Component, name string) string {
	for _, c := range components {
		if c.Name == name {
			return c.User()
		}
	}
	return ""
}

func excuse(list []Allowance, component, verb, group, resource, name string) (Allowance, bool) {
	for _, a := range list {
		if a.Component == component && a.Verb == verb && a.Group == group && a.Resource == resource &&
			(a.Name == "" || a.Name == name) {
			return a, true
		}
	}
	return Allowance{}, false
}

func sortedRequests(m map[Request]int) []Request {
	out := slices.Collect(maps.Keys(m))
	sort.Slice(out, func(i, j int) bool { return fmt.Sprint(out[i]) < fmt.Sprint(out[j]) })
	return out
}

func sortedAccesses(m map[Access]int) []Access {
	out := slices.Collect(maps.Keys(m))
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// Summary is a few lines: the figures of each component.
func (r *Report) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "audit check: %d audit events, %d distinct requests\n", r.Events, r.Requests)
	for _, c := range r.Components {
		fmt.Fprintf(&b, "  %-20s %6d requests (%d by ignored clients), %2d of %2d granted (resource, verb) used, %d unused grants excused, %d denials\n",
			c.Name, c.Requests, c.Ignored, c.UsedResourceVerbs(), c.GrantedResourceVerbs(), c.UnusedExcused, len(c.Denied))
	}
	return b.String()
}

// Details lists, per component, every access used with its count and the
// clients, then the failures and notes: what a role should grant.
func (r *Report) Details() string {
	var b strings.Builder
	b.WriteString(r.Summary())
	for _, c := range r.Components {
		fmt.Fprintf(&b, "\n%s (%s), clients:", c.Name, c.User())
		for _, ua := range slices.Sorted(maps.Keys(c.UserAgents)) {
			fmt.Fprintf(&b, " %s=%d", ua, c.UserAgents[ua])
		}
		b.WriteString("\n")
		for _, a := range sortedAccesses(c.Used) {
			fmt.Fprintf(&b, "  used %7d  %s\n", c.Used[a], a)
		}
		for _, a := range sortedAccesses(c.Elsewhere) {
			fmt.Fprintf(&b, "  else %7d  %s\n", c.Elsewhere[a], a)
		}
		for _, g := range c.Unused {
			fmt.Fprintf(&b, "  unused       %s\n", g)
		}
		for _, req := range sortedRequests(c.Denied) {
			fmt.Fprintf(&b, "  DENIED %5d  %s name %q by %s\n", c.Denied[req], req.Access(), req.Name, req.UserAgent)
		}
	}
	if len(r.Failures) > 0 {
		b.WriteString("\nfailures:\n")
		for _, f := range r.Failures {
			b.WriteString("  " + f + "\n")
		}
	}
	if len(r.Notes) > 0 {
		b.WriteString("\nnotes:\n")
		for _, n := range r.Notes {
			b.WriteString("  " + n + "\n")
		}
	}
	return b.String()
}
