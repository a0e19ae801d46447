// Command strata-manager is every Strata process in one binary: the manager
// daemon now, and the data plane and CSI driver as they are added.
package main

import (
	"os"

	"github.com/strata-storage/strata/app"
)

func main() {
	app.Main(os.Args)
}
