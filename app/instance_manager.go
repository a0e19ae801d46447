package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/signal"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/strata-storage/strata/engine/imserver"
	"github.com/strata-storage/strata/engineapi/impb"
)

// InstanceManagerCommand is `strata-manager instance-manager`: the data
// plane of one node.
func InstanceManagerCommand() *cli.Command {
	return &cli.Command{
		Name:  "instance-manager",
		Usage: "run the data plane of one node: engines, replicas, NBD frontend, gRPC control",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:8500", Usage: "gRPC control address"},
			&cli.StringFlag{Name: "nbd-socket", Required: true, Usage: nbdSocketUsage},
			&cli.StringFlag{Name: "nbd-listen", Usage: nbdListenUsage},
			&cli.StringFlag{Name: "data-host", Value: "127.0.0.1",
				Usage: "IP replicas serve engines on; must be reachable from other nodes"},
			&cli.StringFlag{Name: "state-dir", Required: true,
				Usage: "directory for the instance manager's own state (the replicas to reopen after a restart)"},
			&cli.StringSliceFlag{Name: "disk-path", Required: true,
				Usage: "a directory the instance manager may keep replica data in and read backing images from: a disk " +
					"of the node, or a directory holding its disks; repeat for more. Paths in requests outside every one are refused"},
			&cli.StringSliceFlag{Name: "backup-path",
				Usage: "a directory file:// backup targets may lie in (an NFS mount); repeat for more. None: file:// targets are refused"},
			&cli.StringFlag{Name: "fuse-dir",
				Usage: "serve each exported volume also as the file DIR/<volume>/disk (FUSE, over io_uring where the kernel's " +
					"fuse.enable_uring is on), beside its NBD export; needs CAP_SYS_ADMIN and /dev/fuse. Empty: NBD only"},
			&cli.StringFlag{Name: "fs-freeze-socket",
				Usage: "the node CSI plugin's --freeze-socket: where a snapshot asks for the volume's filesystem to be frozen " +
					"while it is cut. Empty, or no plugin listening there: snapshots are cut as a power cut would leave the volume"},
			&cli.DurationFlag{Name: "size-report-interval", Value: imserver.DefaultSizeReportInterval,
				Usage: "how often engines' snapshot sizes, which grow with writes, are re-read and published if changed (0 or negative: never)"},
		}, instanceManagerTLSFlags()...), // --tls-dir, --data-encryption: app/instance_manager_tls.go
		Action: func(ctx context.Context, cmd *cli.Command) error {
			var opts imserver.Options
			creds := withInstanceManagerTLS(cmd, &opts)
			opts.DataHost, opts.StateDir = cmd.String("data-host"), cmd.String("state-dir")
			opts.DiskPaths, opts.BackupPaths = cmd.StringSlice("disk-path"), cmd.StringSlice("backup-path")
			opts.SizeReportInterval = cmd.Duration("size-report-interval")
			opts.FUSEDir, opts.FSFreezeSocket = cmd.String("fuse-dir"), cmd.String("fs-freeze-socket")
			return runInstanceManager(ctx, cmd.String("listen"), cmd.String("nbd-socket"), cmd.String("nbd-listen"), opts, creds)
		},
	}
}

// runInstanceManager serves opts' instance manager; NBDSocket and Log are
// filled in here.
func runInstanceManager(parent context.Context, listen, nbdSocket, nbdListen string, opts imserver.Options,
	creds grpc.ServerOption) error {
	ctx, stop := signal.NotifyContext(parent, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := logrus.WithField("component", "instance-manager")

	grpcL, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", listen, err)
	}
	nbdSocket, nbdLs, err := nbdListeners(nbdSocket, nbdListen, log)
	if err != nil {
		grpcL.Close()
		return err
	}
	if opts.SizeReportInterval == 0 {
		opts.SizeReportInterval = -1 // 0 would mean the default to imserver; here it means off
	}
	opts.NBDSocket, opts.Log = nbdSocket, log
	srv, err := imserver.New(opts)
	if err != nil {
		grpcL.Close()
		for _, l := range nbdLs {
			l.Close()
		}
		return err
	}
	// Managers ping every 10 s to notice a dead instance manager on an idle
	// Watch; allow it (the default policy closes such clients).
	gs := grpc.NewServer(creds, grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
		MinTime: 5 * time.Second, PermitWithoutStream: true}))
	impb.RegisterInstanceManagerServer(gs, srv)

	errc := make(chan error, 1+len(nbdLs))
	go func() { errc <- gs.Serve(grpcL) }()
	var nbdAddrs []string
	for _, l := range nbdLs {
		go func() { errc <- srv.ServeNBD(l) }()
		nbdAddrs = append(nbdAddrs, l.Addr().String())
	}
	log.WithFields(logrus.Fields{"grpc": grpcL.Addr().String(), "nbd": nbdAddrs,
		"disks": opts.DiskPaths, "backupPaths": opts.BackupPaths}).Info("Instance manager is running")

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	log.Info("Shutting down")
	stopGRPC(gs, grpcStopTimeout)
	if err := srv.Close(); err != nil {
		log.WithError(err).Warn("Closing instances")
	}
	if errors.Is(runErr, grpc.ErrServerStopped) {
		runErr = nil
	}
	return runErr
}

// grpcStopTimeout bounds the wait for running calls at shutdown: the
// managers' watch streams never end by themselves, so a graceful stop alone
// would hold the Pod until the kubelet kills it (its grace period), with
// the replicas and NBD exports never closed cleanly.
const grpcStopTimeout = 5 * time.Second

// stopGRPC stops gs gracefully, and at once after timeout.
func stopGRPC(gs *grpc.Server, timeout time.Duration) {
	done := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		gs.Stop()
		<-done
	}
}
