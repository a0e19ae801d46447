// Command bench-kbench is a thin main over internal/devtools/benchkbench: the
// kbench-style suite through real Pods (make bench-kbench, docs/bench-kbench.md).
package main

import "github.com/strata-storage/strata/internal/devtools/benchkbench"

func main() { benchkbench.Main() }
