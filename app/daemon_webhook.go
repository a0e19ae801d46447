package app

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	smsclient "github.com/kubernetes-csi/external-snapshot-metadata/client/clientset/versioned"
	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v3"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/webhook"
)

// webhookOptions are the daemon's --webhook-* flags.
type webhookOptions struct {
	listen       string
	listener     net.Listener // bound at start-up (runDaemon)
	urlHost      string
	rotateBefore time.Duration
	// The snapshot metadata sidecar's publication (webhook/snapshot_metadata.go).
	metadataAddress, metadataAudience string
}

// webhookFlags are the admission webhook's flags of `strata-manager daemon`.
func webhookFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "webhook-listen", Value: ":9443",
			Usage: "HTTPS address of the admission webhooks; empty disables them (and leaves the configurations to others)"},
		&cli.StringFlag{Name: "webhook-url-host",
			Usage: "local mode: the webhook configurations point at https://HOST:<port> of the leading manager " +
				"instead of the strata-webhook Service"},
		&cli.DurationFlag{Name: "webhook-ca-rotate-before", Value: 30 * 24 * time.Hour,
			Usage: fmt.Sprintf("replace the webhook CA this long before it expires (it is valid for %s)", webhook.CAValidity),
			Validator: func(d time.Duration) error {
				if d <= 0 || d > webhook.CAValidity/2 {
					return fmt.Errorf("--webhook-ca-rotate-before: %s is not between 0 and %s, half the CA's validity",
						d, webhook.CAValidity/2)
				}
				return nil
			}},
		&cli.StringFlag{Name: "snapshot-metadata-address",
			Usage: "host:port where backup tools reach the CSI SnapshotMetadata sidecar (the chart's " +
				webhook.SnapshotMetadataServiceName + " Service); the webhook leader issues the sidecar's certificate " +
				"(Secret " + webhook.SnapshotMetadataSecretName + ") and publishes the SnapshotMetadataService " +
				"naming it. Empty: neither"},
		&cli.StringFlag{Name: "snapshot-metadata-audience", Value: webhook.DefaultSnapshotMetadataAudience,
			Usage: "the audience backup tools ask their tokens for, as the sidecar's --audience"},
	}
}

func webhookOptionsFrom(cmd *cli.Command) webhookOptions {
	return webhookOptions{
		listen:       cmd.String("webhook-listen"),
		urlHost:      cmd.String("webhook-url-host"),
		rotateBefore: cmd.Duration("webhook-ca-rotate-before"),

		metadataAddress:  cmd.String("snapshot-metadata-address"),
		metadataAudience: cmd.String("snapshot-metadata-audience"),
	}
}

// startWebhook binds the webhook's address and runs it in wg until ctx ends.
// Call it once the caches have synced: the rules read them. A disabled
// webhook (--webhook-listen "") starts nothing.
func startWebhook(ctx context.Context, wg *sync.WaitGroup, log logrus.FieldLogger, ds *datastore.DataStore,
	kube kubernetes.Interface, restConfig *rest.Config, cfg daemonConfig) error {
	if cfg.webhook.listen == "" {
		log.Info("Admission webhooks are disabled (--webhook-listen is empty)")
		return nil
	}
	var metadata *webhook.SnapshotMetadataOptions
	if cfg.webhook.metadataAddress != "" {
		client, err := smsclient.NewForConfig(restConfig)
		if err != nil {
			return err
		}
		metadata = &webhook.SnapshotMetadataOptions{Address: cfg.webhook.metadataAddress,
			Audience: cfg.webhook.metadataAudience, Client: client}
	}
	srv, err := webhook.New(log, ds, kube, webhook.Options{
		SnapshotMetadata: metadata,
		Namespace:        cfg.namespace,
		Identity:         cfg.nodeName,
		Listen:           cfg.webhook.listen,
		Listener:         cfg.webhook.listener,
		URLHost:          cfg.webhook.urlHost,
		CARotateBefore:   cfg.webhook.rotateBefore,
		LeaseDuration:    cfg.leaseDuration,
	})
	if err != nil {
		return err
	}
	wg.Go(func() {
		if err := srv.Run(ctx); err != nil && ctx.Err() == nil {
			log.WithError(err).Error("Admission webhooks stopped")
		}
	})
	return nil
}
