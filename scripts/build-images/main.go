// Command build-images builds the local cluster's container images (pause,
// workload, strata-manager) into the Strata cache, or finds them there, and
// prints one "ref<TAB>tarball" line per image, ready for
// `ctr -n k8s.io images import <tarball>`.
//
//	go run ./scripts/build-images --manager-bin bin/strata-manager
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v3"

	"github.com/strata-storage/strata/package/images"
)

func main() {
	cmd := &cli.Command{
		Name:  "build-images",
		Usage: "build the local cluster's container images as docker-archive tarballs",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "manager-bin", Required: true, Usage: "the strata-manager binary for the strata image"},
			&cli.StringFlag{Name: "cache-dir", Usage: "cache directory (default $STRATA_CACHE or ~/.cache/strata)"},
		},
		Action: run,
	}
	if err := cmd.Run(context.Background(), os.Args); err != nil {
		logrus.WithError(err).Error("build-images failed")
		os.Exit(1)
	}
}

func run(ctx context.Context, cmd *cli.Command) error {
	// Logs go to stderr, so stdout is only the ref/tarball lines.
	log := logrus.New()
	log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: "15:04:05"})
	built, err := images.BuildAll(ctx, images.Options{
		CacheDir:   cmd.String("cache-dir"),
		ManagerBin: cmd.String("manager-bin"),
		Log:        log,
	})
	if err != nil {
		return err
	}
	for _, img := range built {
		fmt.Printf("%s\t%s\n", img.Ref, img.Tar)
	}
	return nil
}
