// Package importcheck fails a package import that points up the layers of
// Strata's tree or across its controller families, or a production
// package that imports a development tool. make verify runs it
// (scripts/check-imports) on `go list`'s view of the module; the layers
// are drawn in docs/architecture.md.
//
// Written here rather than taken from depguard or go-arch-lint: the rules
// are a short table over import paths, and neither tool can say "the
// packages the strata binary links" (rule 1) without a list kept by hand.
package importcheck

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Package is one package of the module as go list reports it, with paths
// relative to the module ("" is the module's root package).
type Package struct {
	Path        string
	Imports     []string // the module's own packages only, relative too
	TestImports []string // its tests' (in-package and _test package) imports
}

// layers ranks the tree from the bottom up, by the longest matching path
// prefix: a package may import its own rank and below. Tools (devtools,
// test, scripts) are above every rank and are not checked.
var layers = []struct {
	prefix string
	rank   int
}{
	{"types", 0}, {"k8s", 0}, {"internal", 0}, {"engineapi/impb", 0},
	{"engine", 1}, {"engineapi", 1}, {"internal/fsfreeze", 1},
	{"datastore", 2}, {"scheduler", 2}, {"csi/nbddev", 2},
	{"controller", 3}, {"webhook", 3}, {"casigner", 3}, {"csi", 3},
	{"api", 4},
	{"app", 5},
	{"package", 6}, {"", 6},
}

// clientsOnly are the packages that talk to Strata as its users' tools
// do: through types, clients and libraries, never the managers' own
// controllers, webhooks or caches.
var clientsOnly = map[string][]string{
	"api":               {"controller", "webhook", "csi"},
	"app/kubectlstrata": {"controller", "webhook", "csi", "datastore", "scheduler", "engine", "api"},
}

// tool tells the development tools apart: harnesses, benches, test
// support and their mains. The controllers' test support (fixture, kittest)
// lives beside them so their tests can share it; production never imports it.
func tool(path string) bool {
	return under(path, "internal/devtools") || under(path, "test") || under(path, "scripts") ||
		under(path, "controller/fixture") || under(path, "controller/kit/kittest")
}

func under(path, prefix string) bool {
	return prefix == "" || path == prefix || strings.HasPrefix(path, prefix+"/")
}

// rank is path's layer, by its longest matching prefix.
func rank(path string) int {
	best, r := -1, 0
	for _, l := range layers {
		if under(path, l.prefix) && len(l.prefix) > best {
			best, r = len(l.prefix), l.rank
		}
	}
	return r
}

// family is a package's family among its rank's peers: the top-level
// directory, and under controller/ the family package (controller/volume,
// …), so that families import neither each other nor the top's siblings.
// controller/kit is every family's shared kit, importable by all.
func family(path string) string {
	parts := strings.SplitN(path, "/", 3)
	if parts[0] == "controller" && len(parts) > 1 {
		return "controller/" + parts[1]
	}
	return parts[0]
}

// acrossAllowed: same-rank imports between top-level directories are
// allowed below the control plane (the libraries, the data plane and its
// client build on each other); among controller, webhook, csi and the
// controller families they are not.
func acrossAllowed(from, to string) bool {
	if rank(from) < 3 || family(to) == "controller/kit" {
		return true
	}
	return family(from) == family(to) || strings.HasPrefix(family(to), family(from)+"/")
}

// Check returns every rule broken, sorted; production are the paths the
// strata binary links (rule 1: no tool among them).
func Check(pkgs []Package, production []string) []string {
	var out []string
	for _, p := range production {
		if tool(p) {
			out = append(out, fmt.Sprintf("%s: a development tool linked into the strata binary", p))
		}
	}
	for _, p := range pkgs {
		if tool(p.Path) {
			continue
		}
		for _, imp := range p.Imports {
			out = append(out, violations(p.Path, imp, false)...)
		}
		// A family's tests keep to its boundaries too; they may use test support.
		for _, imp := range p.TestImports {
			if imp != p.Path {
				out = append(out, violations(p.Path, imp, true)...)
			}
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

func violations(from, to string, test bool) []string {
	var out []string
	switch {
	case tool(to) && test:
	case tool(to):
		out = append(out, fmt.Sprintf("%s -> %s: a production package imports a development tool", from, to))
	case rank(to) > rank(from):
		out = append(out, fmt.Sprintf("%s -> %s: points up the layers (%d -> %d)", from, to, rank(from), rank(to)))
	case rank(to) == rank(from) && !acrossAllowed(from, to):
		out = append(out, fmt.Sprintf("%s -> %s: across families (%s -> %s)", from, to, family(from), family(to)))
	}
	for owner, banned := range clientsOnly {
		if !under(from, owner) {
			continue
		}
		for _, b := range banned {
			if under(to, b) {
				out = append(out, fmt.Sprintf("%s -> %s: %s talks to Strata through types and clients only", from, to, owner))
			}
		}
	}
	return out
}
