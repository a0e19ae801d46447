// check-imports fails on an import that points up Strata's layers or
// across its controller families, and on a development tool linked into
// the strata binary (internal/devtools/importcheck has the rules). make
// verify runs it from the repository root.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/strata-storage/strata/internal/devtools/importcheck"
)

const module = "github.com/strata-storage/strata"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "check-imports:", err)
		os.Exit(1)
	}
}

func run() error {
	pkgs, err := listPackages()
	if err != nil {
		return err
	}
	deps, err := goList("-deps", "-f", "{{.ImportPath}}", ".")
	if err != nil {
		return err
	}
	var production []string
	for _, p := range strings.Fields(string(deps)) {
		if rel, ok := relative(p); ok {
			production = append(production, rel)
		}
	}
	broken := importcheck.Check(pkgs, production)
	for _, b := range broken {
		fmt.Println(b)
	}
	if len(broken) > 0 {
		return fmt.Errorf("%d import rules broken (docs/architecture.md draws the layers)", len(broken))
	}
	fmt.Printf("%d packages: no import up the layers or across families, no tool in the binary\n", len(pkgs))
	return nil
}

// listPackages is every package of the module with its own and its tests'
// imports of the module's own packages.
func listPackages() ([]importcheck.Package, error) {
	out, err := goList("-json=ImportPath,Imports,TestImports,XTestImports", "./...")
	if err != nil {
		return nil, err
	}
	var pkgs []importcheck.Package
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath                string
			Imports                   []string
			TestImports, XTestImports []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, err
		}
		rel, ok := relative(p.ImportPath)
		if !ok {
			continue
		}
		pkg := importcheck.Package{Path: rel}
		for _, imp := range p.Imports {
			if r, ok := relative(imp); ok {
				pkg.Imports = append(pkg.Imports, r)
			}
		}
		for _, imp := range append(p.TestImports, p.XTestImports...) {
			if r, ok := relative(imp); ok {
				pkg.TestImports = append(pkg.TestImports, r)
			}
		}
		pkgs = append(pkgs, pkg)
	}
	return pkgs, nil
}

func relative(path string) (string, bool) {
	if path == module {
		return "", true
	}
	rel, ok := strings.CutPrefix(path, module+"/")
	return rel, ok
}

func goList(args ...string) ([]byte, error) {
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s: %w", strings.Join(args, " "), err)
	}
	return out, nil
}
