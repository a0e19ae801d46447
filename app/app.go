// Package app holds strata-manager's subcommands and the wiring behind them.
package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v3"

	"github.com/strata-storage/strata/app/kubectlstrata"
)

// Version is set at build time with -ldflags "-X .../app.Version=...".
var Version = "dev"

// NewCommand is the strata-manager command line.
func NewCommand() *cli.Command {
	return &cli.Command{
		Name:    "strata-manager",
		Usage:   "block storage for Kubernetes: manager, data plane and CSI in one binary",
		Version: Version,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warning or error",
				Sources: cli.EnvVars("STRATA_LOG_LEVEL")},
			&cli.BoolFlag{Name: "log-json", Usage: "log JSON lines instead of text", Sources: cli.EnvVars("STRATA_LOG_JSON")},
		},
		Before: func(ctx context.Context, cmd *cli.Command) (context.Context, error) {
			level, err := logrus.ParseLevel(cmd.String("log-level"))
			if err != nil {
				return ctx, fmt.Errorf("--log-level: %w", err)
			}
			logrus.SetLevel(level)
			if cmd.Bool("log-json") {
				logrus.SetFormatter(&logrus.JSONFormatter{})
			} else {
				logrus.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
			}
			return ctx, nil
		},
		Commands: []*cli.Command{DaemonCommand(), InstanceManagerCommand(), CSICommand(), CASignerCommand(), UninstallCheckCommand()},
	}
}

// Main runs the command line and exits non-zero on error. Invoked as
// kubectl-strata (a link to this binary) it is the kubectl plugin.
func Main(args []string) {
	if len(args) > 0 && strings.HasPrefix(filepath.Base(args[0]), "kubectl-strata") {
		kubectlstrata.Main(args)
		return
	}
	if err := NewCommand().Run(context.Background(), args); err != nil {
		logrus.WithError(err).Error("strata-manager failed")
		os.Exit(1)
	}
}
