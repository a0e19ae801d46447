// Command bench-backup is a thin main over internal/devtools/benchbackup: the backup and restore bench (make bench-backup, docs/bench-backup.md).
package main

import "github.com/strata-storage/strata/internal/devtools/benchbackup"

func main() { benchbackup.Main() }
