package app

import (
	"context"
	"fmt"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v3"

	"github.com/strata-storage/strata/csi"
	"github.com/strata-storage/strata/csi/nbddev"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/internal/fsfreeze"
	"github.com/strata-storage/strata/types"
)

// CSICommand is `strata-manager csi`: the CSI driver driver.strata.io.
func CSICommand() *cli.Command {
	return &cli.Command{
		Name:  "csi",
		Usage: "run the CSI driver " + csi.DriverName + " (controller and/or node services)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "csi-address", Value: "/csi/csi.sock", Usage: "unix socket the sidecars and the kubelet dial"},
			&cli.StringFlag{Name: "mode", Value: string(csi.ModeBoth), Usage: "controller, node or both"},
			&cli.StringFlag{Name: "node-name", Usage: "the Strata node this plugin runs on (node mode)", Sources: cli.EnvVars("NODE_NAME")},
			&cli.StringFlag{Name: "kubelet-root", Value: "/var/lib/kubelet",
				Usage: "the kubelet's --root-dir; the node plugin registers in its plugins_registry/"},
			&cli.StringFlag{Name: "state-dir", Value: "/var/lib/strata-csi",
				Usage: "node mode: where the NBD connections' records and FUSE mount points live (a host path that survives restarts)"},
			&cli.StringFlag{Name: "daemon-cgroup-root",
				Usage: "node mode in a Pod: the host's cgroup filesystem as mounted here; each nbdfuse moves to the cgroup " +
					"strata-nbdfuse beside kubepods, so that a plugin restart or upgrade leaves volumes in use working"},
			&cli.StringFlag{Name: "instance-manager-file-dir",
				Usage: "node mode: the instance manager's --fuse-dir as mounted here; a volume served there gets its loop device " +
					"on that file instead of on nbdfuse's (no NBD hop). Empty: nbdfuse for every volume"},
			&cli.StringFlag{Name: "freeze-socket",
				Usage: "node mode: unix socket on which the node's instance manager asks for a staged volume's filesystem to be " +
					"frozen while a snapshot is cut (its --fs-freeze-socket). Empty: none, snapshots are crash-consistent"},
			&cli.StringFlag{Name: "kubeconfig", Usage: "kubeconfig file; empty means in-cluster (controller mode; node mode makes no API call)",
				Sources: cli.EnvVars("KUBECONFIG")},
			&cli.StringFlag{Name: "namespace", Value: types.DefaultNamespace, Usage: "namespace of Strata's objects",
				Sources: cli.EnvVars("STRATA_NAMESPACE")},
		},
		Action: func(ctx context.Context, cmd *cli.Command) error {
			mode, err := csi.ParseMode(cmd.String("mode"))
			if err != nil {
				return err
			}
			return runCSI(ctx, csiConfig{mode: mode, address: cmd.String("csi-address"), nodeName: cmd.String("node-name"),
				kubeletRoot: cmd.String("kubelet-root"), kubeconfig: cmd.String("kubeconfig"), namespace: cmd.String("namespace"),
				stateDir: cmd.String("state-dir"), daemonCgroupRoot: cmd.String("daemon-cgroup-root"),
				imFileDir: cmd.String("instance-manager-file-dir"), freezeSocket: cmd.String("freeze-socket")})
		},
	}
}

type csiConfig struct {
	mode                                                            csi.Mode
	address, nodeName, kubeletRoot, kubeconfig, namespace, stateDir string
	daemonCgroupRoot, imFileDir, freezeSocket                       string
}

func runCSI(parent context.Context, cfg csiConfig) error {
	ctx, stop := signal.NotifyContext(parent, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := logrus.WithField("node", cfg.nodeName)
	// The node services read nothing from the API server: a node plugin
	// makes no client at all (its ServiceAccount has no role). The
	// controller services watch only the kinds they read.
	var ds *datastore.DataStore
	var blocks csi.BlocksSource
	if cfg.mode != csi.ModeNode {
		kubeClient, strataClient, restCfg, err := newClients(cfg.kubeconfig, "strata-csi")
		if err != nil {
			return err
		}
		if ds, err = datastore.NewWatching(cfg.namespace, strataClient, kubeClient, csi.ControllerKinds); err != nil {
			return err
		}
		blocks = &restBlocks{kube: kubeClient, ds: ds, restCfg: restCfg, namespace: cfg.namespace}
	}
	var connector nbddev.Connector
	if cfg.mode != csi.ModeController {
		var err error
		connector, err = nbddev.New(nbddev.Options{StateDir: cfg.stateDir, InstanceManagerFileDir: cfg.imFileDir,
			DaemonCgroupRoot: cfg.daemonCgroupRoot}, log)
		if err != nil {
			return err
		}
		// Loop devices an instance manager's replacement left behind while
		// this plugin was away are released before it serves again.
		if r, ok := connector.(interface{ ReleaseStale(context.Context) error }); ok {
			if err := r.ReleaseStale(ctx); err != nil {
				log.WithError(err).Warn("Some loop devices on gone instance-manager files could not be released; their unstage will try again")
			}
		}
	}
	freezer, err := newFreezer(cfg, connector, log)
	if err != nil {
		return err
	}
	driver, err := csi.NewDriver(csi.Options{NodeID: cfg.nodeName, Mode: cfg.mode, Version: Version, Store: ds,
		Connector: connector, Blocks: blocks, Freezer: freezer, Log: log})
	if err != nil {
		return err
	}

	// The socket is served at once (the sidecars wait on Probe); calls are
	// answered from the caches once they have synced.
	errc := make(chan error, 3)
	var wg sync.WaitGroup
	wg.Go(func() { errc <- driver.Serve(ctx, cfg.address) })
	if freezer != nil {
		wg.Go(func() { errc <- freezer.Serve(ctx, cfg.freezeSocket) })
	}
	if cfg.mode != csi.ModeController {
		registrar := csi.NewRegistrar(cfg.address, log)
		wg.Go(func() { errc <- registrar.Serve(ctx, csi.RegistrationSocket(cfg.kubeletRoot)) })
	}
	start := time.Now()
	if ds != nil {
		ds.Start(ctx)
		if err := ds.WaitForCacheSync(ctx); err != nil {
			stop()
			wg.Wait()
			return err
		}
	}
	driver.SetReady(true)
	log.WithField("elapsed", time.Since(start).Round(time.Millisecond)).Info("CSI driver ready")

	select {
	case <-ctx.Done():
	case err = <-errc:
		stop()
	}
	wg.Wait()
	return err
}

// newFreezer makes the node plugin's filesystem freezer (internal/fsfreeze)
// and thaws what a killed plugin left frozen, before anything is served.
func newFreezer(cfg csiConfig, connector nbddev.Connector, log logrus.FieldLogger) (*fsfreeze.Freezer, error) {
	if cfg.freezeSocket == "" || cfg.mode == csi.ModeController {
		return nil, nil
	}
	resolve := func(volume string) (fsfreeze.Target, error) {
		device, ok, err := connector.Device(volume)
		if err != nil || !ok {
			return fsfreeze.Target{}, err
		}
		mountPoint, err := fsfreeze.MountPointOf(device)
		return fsfreeze.Target{Device: device, MountPoint: mountPoint}, err
	}
	f := fsfreeze.New(filepath.Join(cfg.stateDir, "frozen"), resolve, fsfreeze.SystemOps, log)
	if err := f.Recover(); err != nil {
		return nil, fmt.Errorf("thawing filesystems a stopped plugin left frozen: %w", err)
	}
	return f, nil
}
