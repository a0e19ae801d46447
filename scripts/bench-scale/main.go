// Command bench-scale is a thin main over internal/devtools/benchscale: the control-plane scale bench (docs/bench-scale.md).
package main

import "github.com/strata-storage/strata/internal/devtools/benchscale"

func main() { benchscale.Main() }
