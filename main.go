// Command strata-manager is every Strata process in one binary: the manager
// daemon and the instance manager (data plane) now, and the CSI driver later.
package main

import (
	"os"

	"github.com/strata-storage/strata/app"
)

func main() {
	app.Main(os.Args)
}
