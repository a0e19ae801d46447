// Command bench-scale is a thin main over internal/benchscale: the control-plane scale bench (docs/bench-scale.md).
package main

import "github.com/strata-storage/strata/internal/benchscale"

func main() { benchscale.Main() }
