// Command bench-pod-start is a thin main over internal/devtools/benchpodstart: how
// long a Pod on a new, a restored and a cloned claim takes to run, step by
// step (docs/bench-pod-start.md).
package main

import "github.com/strata-storage/strata/internal/devtools/benchpodstart"

func main() { benchpodstart.Main() }
