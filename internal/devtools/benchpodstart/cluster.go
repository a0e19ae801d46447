package benchpodstart

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/internal/devtools/localcluster"
)

// upLine is what run-local prints once everything is usable.
const upLine = "Strata runs locally"

// startRunLocal starts `make run`'s program in runDir and waits until it
// says the cluster is up; stop interrupts it (as Ctrl-C would) and waits
// for its teardown.
func startRunLocal(ctx context.Context, log logrus.FieldLogger, runLocal, managerBin, runDir string) (stop func() error, err error) {
	out := filepath.Join(runDir, "run-local.log")
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return nil, err
	}
	p, err := localcluster.StartProcess("run-local", out, runLocal, "--manager-bin", managerBin, "--run-dir", filepath.Join(runDir, "c"))
	if err != nil {
		return nil, err
	}
	stop = func() error { return p.Stop(2 * time.Minute) }
	log.WithField("log", out).Info("starting run-local (make run)")
	deadline := time.Now().Add(20 * time.Minute) // cold tools are built on the way
	for !fileHas(out, upLine) {
		select {
		case <-ctx.Done():
			return nil, errors.Join(ctx.Err(), stop())
		case <-p.Done():
			return nil, fmt.Errorf("run-local exited before the cluster was up: %v\n%s", p.Err(), p.LogTail(30))
		case <-time.After(500 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, errors.Join(errors.New("run-local: not up after 20 minutes"), stop())
		}
	}
	return stop, nil
}

func fileHas(path, s string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			return true
		}
	}
	return false
}
