// Command run-local is a thin main over internal/devtools/runlocal: make run.
package main

import "github.com/strata-storage/strata/internal/devtools/runlocal"

func main() { runlocal.Main() }
