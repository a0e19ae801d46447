package app

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	smsclient "github.com/kubernetes-csi/external-snapshot-metadata/client/clientset/versioned"
	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v3"

	"github.com/strata-storage/strata/casigner"
	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/types"
)

// CASignerCommand is `strata-manager ca-signer`: the one process that holds
// Strata's CA key (package casigner).
func CASignerCommand() *cli.Command {
	return &cli.Command{
		Name: "ca-signer",
		Usage: "hold Strata's CA: sign the managers' certificate requests for their own node, rotate the CA, " +
			"publish its bundle (ConfigMap " + types.CABundleConfigMap + ")",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "kubeconfig", Usage: "kubeconfig file; empty means in-cluster", Sources: cli.EnvVars("KUBECONFIG")},
			&cli.StringFlag{Name: "namespace", Value: types.DefaultNamespace, Usage: "namespace of Strata's objects",
				Sources: cli.EnvVars("POD_NAMESPACE")},
			&cli.StringFlag{Name: "identity", Sources: cli.EnvVars("POD_NAME"),
				Usage: "this replica's name in the Lease " + types.SignerLeaseName + "; empty: the host name"},
			&cli.DurationFlag{Name: "lease-duration", Value: 15 * time.Second,
				Usage: "validity of the leader Lease; a dead leader is replaced about this long after its last renewal"},
			&cli.DurationFlag{Name: "ca-rotate-before", Value: 30 * 24 * time.Hour,
				Usage: fmt.Sprintf("replace the CA this long before it expires (it is valid for %s)", pki.CAValidity)},
			&cli.StringFlag{Name: "snapshot-metadata-address",
				Usage: "host:port where backup tools reach the CSI SnapshotMetadata sidecar (the chart's " +
					casigner.SnapshotMetadataServiceName + " Service); the signer issues the sidecar's certificate " +
					"(Secret " + casigner.SnapshotMetadataSecretName + ") and publishes the SnapshotMetadataService " +
					"naming it. Empty: neither"},
			&cli.StringFlag{Name: "snapshot-metadata-audience", Value: casigner.DefaultSnapshotMetadataAudience,
				Usage: "the audience backup tools ask their tokens for, as the sidecar's --audience"},
		},
		Action: runCASigner,
	}
}

func runCASigner(parent context.Context, cmd *cli.Command) error {
	ctx, stop := signal.NotifyContext(parent, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	kube, _, restConfig, err := newClients(cmd.String("kubeconfig"), "strata-ca-signer")
	if err != nil {
		return err
	}
	identity := cmd.String("identity")
	if identity == "" {
		if identity, err = os.Hostname(); err != nil {
			return fmt.Errorf("--identity: empty, and no host name: %w", err)
		}
	}
	opts := casigner.Options{Namespace: cmd.String("namespace"), Identity: identity,
		LeaseDuration: cmd.Duration("lease-duration"), CARotateBefore: cmd.Duration("ca-rotate-before")}
	if address := cmd.String("snapshot-metadata-address"); address != "" {
		client, err := smsclient.NewForConfig(restConfig)
		if err != nil {
			return err
		}
		opts.SnapshotMetadata = &casigner.SnapshotMetadataOptions{Address: address,
			Audience: cmd.String("snapshot-metadata-audience"), Client: client}
	}
	log := logrus.WithField("identity", identity)
	srv, err := casigner.New(log, kube, opts)
	if err != nil {
		return err
	}
	log.WithField("namespace", opts.Namespace).Info("strata-manager ca-signer is running")
	return srv.Run(ctx)
}
