package app

import (
	"context"
	"net"
	"sync"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v3"
	"k8s.io/client-go/kubernetes"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/webhook"
)

// webhookOptions are the daemon's --webhook-* flags.
type webhookOptions struct {
	listen   string
	listener net.Listener // bound at start-up (runDaemon)
	urlHost  string
}

// webhookFlags are the admission webhook's flags of `strata-manager daemon`.
// The CA's rotation and the snapshot metadata sidecar's certificate are the
// CA signer's (strata-manager ca-signer).
func webhookFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "webhook-listen", Value: ":9443",
			Usage: "HTTPS address of the admission webhooks; empty disables them (and leaves the configurations to others)"},
		&cli.StringFlag{Name: "webhook-url-host",
			Usage: "local mode: the webhook configurations point at https://HOST:<port> of the leading manager " +
				"instead of the strata-webhook Service"},
	}
}

func webhookOptionsFrom(cmd *cli.Command) webhookOptions {
	return webhookOptions{listen: cmd.String("webhook-listen"), urlHost: cmd.String("webhook-url-host")}
}

// webhookHosts are the names of this manager's webhook serving certificate;
// none when the webhook is disabled.
func webhookHosts(cfg daemonConfig) []string {
	if cfg.webhook.listen == "" {
		return nil
	}
	listenHost, _, _ := net.SplitHostPort(cfg.webhook.listen)
	return webhook.ServingHosts(cfg.namespace, listenHost, cfg.webhook.urlHost)
}

// startWebhook binds the webhook's address and runs it in wg until ctx ends.
// Call it once the caches have synced: the rules read them. A disabled
// webhook (--webhook-listen "") starts nothing.
func startWebhook(ctx context.Context, wg *sync.WaitGroup, log logrus.FieldLogger, ds *datastore.DataStore,
	kube kubernetes.Interface, keeper *pki.Keeper, cfg daemonConfig) error {
	if cfg.webhook.listen == "" {
		log.Info("Admission webhooks are disabled (--webhook-listen is empty)")
		return nil
	}
	srv, err := webhook.New(log, ds, kube, webhook.Options{
		Namespace:     cfg.namespace,
		Identity:      cfg.nodeName,
		Listen:        cfg.webhook.listen,
		Listener:      cfg.webhook.listener,
		URLHost:       cfg.webhook.urlHost,
		Serving:       &keeper.Webhook,
		Trust:         keeper.Trust,
		LeaseDuration: cfg.leaseDuration,
	})
	if err != nil {
		return err
	}
	keeper.OnTrustChange(srv.TrustChanged)
	wg.Go(func() {
		if err := srv.Run(ctx); err != nil && ctx.Err() == nil {
			log.WithError(err).Error("Admission webhooks stopped")
		}
	})
	return nil
}
