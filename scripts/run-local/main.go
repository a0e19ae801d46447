// Command run-local is a thin main over internal/runlocal: make run.
package main

import "github.com/strata-storage/strata/internal/runlocal"

func main() { runlocal.Main() }
