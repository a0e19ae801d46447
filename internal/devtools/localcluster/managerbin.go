package localcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// ManagerBinEnv names a strata-manager binary already built for this run:
// `make test` builds it once and hands it to every test package that runs
// it, instead of each package building its own.
const ManagerBinEnv = "STRATA_MANAGER_BIN"

// ManagerBinary returns the strata-manager to run: $STRATA_MANAGER_BIN when
// set (it must exist), otherwise one built from the checkout into dir (so a
// plain `go test ./test/e2e/` still works).
func ManagerBinary(ctx context.Context, dir string) (string, error) {
	if bin := os.Getenv(ManagerBinEnv); bin != "" {
		abs, err := filepath.Abs(bin)
		if err != nil {
			return "", err
		}
		if st, err := os.Stat(abs); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%s=%s is not an executable file (%v)", ManagerBinEnv, bin, err)
		}
		return abs, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "strata-manager")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	build.Dir, build.Stdout, build.Stderr = root, os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("building strata-manager: %w", err)
	}
	return bin, nil
}
