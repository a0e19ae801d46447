// Package hostpackages is the one list of Debian packages Strata needs on a
// host (packages.txt): scripts/host-packages.sh installs from it for make
// run, make test and .ci/run, and the image recipe copies the programs of
// its image role. Keeping one list is what stops them drifting.
package hostpackages

import (
	_ "embed"
	"fmt"
	"slices"
	"strings"
	"sync"
)

//go:embed packages.txt
var list string

// Roles of an entry.
const (
	RoleBuild = "build" // make verify and the Makefile
	RoleNode  = "node"  // the local cluster's kubelet nodes
	RoleImage = "image" // the programs the Strata image carries
	RoleBench = "bench" // the benchmarks' own tools (fio, and its image)
)

// Entry is one file a role needs and the Debian package that has it.
type Entry struct {
	Role    string
	Package string
	// File is a program name (looked up in the bin and sbin directories)
	// or an absolute path.
	File string
}

// Entries are packages.txt's entries, in its order, parsed once.
var Entries = sync.OnceValue(func() []Entry {
	entries, err := parse(list)
	if err != nil {
		panic(err) // the embedded list is checked by the package's tests
	}
	return entries
})

// ForRole are the entries of one role.
func ForRole(role string) []Entry {
	var out []Entry
	for _, e := range Entries() {
		if e.Role == role {
			out = append(out, e)
		}
	}
	return out
}

func parse(text string) ([]Entry, error) {
	var out []Entry
	for i, line := range strings.Split(text, "\n") {
		if j := strings.IndexByte(line, '#'); j >= 0 {
			line = line[:j]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 3 {
			return nil, fmt.Errorf("packages.txt line %d: want role, package and file, got %q", i+1, line)
		}
		if !slices.Contains([]string{RoleBuild, RoleNode, RoleImage, RoleBench}, f[0]) {
			return nil, fmt.Errorf("packages.txt line %d: unknown role %q", i+1, f[0])
		}
		out = append(out, Entry{Role: f[0], Package: f[1], File: f[2]})
	}
	return out, nil
}
