// Command strata-manager is every Strata process in one binary: the manager
// daemon, the instance manager (data plane), the CSI driver (controller and
// node plugin) and, installed as kubectl-strata, the kubectl plugin.
package main

import (
	"os"

	"github.com/strata-storage/strata/app"
)

func main() {
	app.Main(os.Args)
}
