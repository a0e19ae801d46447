// Command crd-quantity rewrites, in place, the quantity fields of the CRD
// files it is given, so a value that is no quantity is refused with "not a
// quantity such as 10Gi" (internal/devtools/crdquantity). k8s/codegen.sh runs it on
// controller-gen's output:
//
//	go run ./scripts/crd-quantity k8s/crds/*.yaml
package main

import (
	"fmt"
	"os"

	"github.com/strata-storage/strata/internal/devtools/crdquantity"
)

func main() {
	for _, path := range os.Args[1:] {
		if err := rewrite(path); err != nil {
			fmt.Fprintln(os.Stderr, "crd-quantity:", err)
			os.Exit(1)
		}
	}
}

func rewrite(path string) error {
	crd, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, n, err := crdquantity.Rewrite(crd)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if n == 0 {
		return nil
	}
	return os.WriteFile(path, out, 0o644)
}
