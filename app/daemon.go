package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	kubescheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/metrics/legacyregistry"
	_ "k8s.io/component-base/metrics/prometheus/workqueue" // workqueue depth, adds, latency on /metrics

	"github.com/strata-storage/strata/api"
	"github.com/strata-storage/strata/controller"
	"github.com/strata-storage/strata/controller/attachment"
	"github.com/strata-storage/strata/controller/backingimage"
	"github.com/strata-storage/strata/controller/backup"
	"github.com/strata-storage/strata/controller/instance"
	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/controller/node"
	"github.com/strata-storage/strata/controller/quota"
	"github.com/strata-storage/strata/controller/setting"
	"github.com/strata-storage/strata/controller/snapshot"
	"github.com/strata-storage/strata/controller/volume"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned"
	stratascheme "github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned/scheme"
	"github.com/strata-storage/strata/types"
)

// DaemonCommand is `strata-manager daemon`: the controllers of one node.
func DaemonCommand() *cli.Command {
	return &cli.Command{
		Name:  "daemon",
		Usage: "run the manager of one node: its controllers, heartbeat and metrics",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "node-name", Required: true, Usage: "name of this node", Sources: cli.EnvVars("NODE_NAME")},
			&cli.StringFlag{Name: "kubeconfig", Usage: "kubeconfig file; empty means in-cluster", Sources: cli.EnvVars("KUBECONFIG")},
			&cli.StringFlag{Name: "namespace", Value: types.DefaultNamespace, Usage: "namespace of Strata's objects",
				Sources: cli.EnvVars("POD_NAMESPACE")},
			&cli.StringSliceFlag{Name: "disk", Usage: "a data directory, as PATH or NAME=PATH; repeat for more disks. " +
				"Registered when the node is first created"},
			&cli.StringFlag{Name: "metrics-listen", Value: ":9500", Usage: "address for /metrics and /healthz; empty disables"},
			&cli.DurationFlag{Name: "lease-duration", Value: 20 * time.Second,
				Usage: "heartbeat lease validity; peers mark this node down after this long without a renewal"},
			&cli.DurationFlag{Name: "disk-check-interval", Value: 30 * time.Second, Usage: "how often disks are inspected"},
			&cli.DurationFlag{Name: "free-space-report-interval", Value: node.DefaultFreeSpaceReportInterval,
				Usage: "least time between two Node writes that report only moved free space; other disk changes are written at once"},
			&cli.IntFlag{Name: "workers", Value: 2, Usage: "workers per controller"},
			&cli.DurationFlag{Name: "max-retry-delay", Value: kit.DefaultRetryBackoff.MaxDelay,
				Usage: "longest wait between retries of an object whose sync keeps failing (retries never stop)"},
			&cli.StringFlag{Name: "api-listen", Value: ":9501", Usage: "address of the HTTP API (backing image uploads, copies between managers); empty disables"},
			&cli.StringFlag{Name: "api-advertise-address", Sources: cli.EnvVars("STRATA_API_ADVERTISE_ADDRESS"),
				Usage: "host:port peers reach the HTTP API at; empty: --api-listen's, with $POD_IP as host when it names none"},
			&cli.StringFlag{Name: "upload-size-limit", Value: "256Gi", Usage: "largest backing image upload accepted (a quantity: 10Gi)"},
			&cli.StringFlag{Name: "instance-manager-address", Sources: cli.EnvVars("STRATA_INSTANCE_MANAGER_ADDRESS"),
				Usage: "gRPC address of this node's instance manager; empty: the node has no data plane"},
			&cli.StringFlag{Name: "instance-manager-pods",
				Usage: "label selector of the instance managers' Pods in --namespace, when they are Pods of OnDelete DaemonSets " +
					"(the chart): this node's is replaced by the DaemonSet's newest revision once no attached volume uses the node"},
		}, append(webhookFlags(), tlsFlags()...)...), // --webhook-*: app/daemon_webhook.go; TLS: app/daemon_tls.go
		Action: func(ctx context.Context, cmd *cli.Command) error {
			disks, err := parseDisks(cmd.StringSlice("disk"))
			if err != nil {
				return err
			}
			uploadLimit, err := resource.ParseQuantity(cmd.String("upload-size-limit"))
			if err != nil || uploadLimit.Sign() < 0 {
				return fmt.Errorf("--upload-size-limit %q: want a non-negative quantity such as 10Gi", cmd.String("upload-size-limit"))
			}
			apiAdvertise, err := advertiseAddress(cmd.String("api-listen"), cmd.String("api-advertise-address"), os.Getenv("POD_IP"))
			if err != nil {
				return err
			}
			if d := cmd.Duration("lease-duration"); d < time.Second {
				return fmt.Errorf("--lease-duration: %s is shorter than 1s", d)
			}
			return runDaemon(ctx, daemonConfig{
				nodeName:                cmd.String("node-name"),
				kubeconfig:              cmd.String("kubeconfig"),
				namespace:               cmd.String("namespace"),
				disks:                   disks,
				metricsListen:           cmd.String("metrics-listen"),
				leaseDuration:           cmd.Duration("lease-duration"),
				diskCheckInterval:       cmd.Duration("disk-check-interval"),
				freeSpaceReportInterval: cmd.Duration("free-space-report-interval"),
				workers:                 int(cmd.Int("workers")),
				maxRetryDelay:           cmd.Duration("max-retry-delay"),
				imAddress:               cmd.String("instance-manager-address"),
				imTLSDir:                cmd.String("instance-manager-tls-dir"),
				apiClientCA:             cmd.String("api-client-ca-configmap"),
				imPodSelector:           cmd.String("instance-manager-pods"),
				apiListen:               cmd.String("api-listen"),
				apiAdvertise:            apiAdvertise,
				uploadLimit:             uploadLimit.Value(),
				webhook:                 webhookOptionsFrom(cmd),
			})
		},
	}
}

type daemonConfig struct {
	nodeName, kubeconfig, namespace string
	disks                           []node.DiskConfig
	metricsListen                   string
	leaseDuration                   time.Duration
	diskCheckInterval               time.Duration
	freeSpaceReportInterval         time.Duration
	workers                         int
	maxRetryDelay                   time.Duration
	imAddress                       string
	imTLSDir                        string
	apiClientCA                     string // namespace/name, app/daemon_tls.go
	imPodSelector                   string
	apiListen, apiAdvertise         string
	uploadLimit                     int64
	webhook                         webhookOptions // app/daemon_webhook.go
}

// parseDisks reads --disk values: PATH names the disk disk-N by position,
// NAME=PATH names it NAME.
func parseDisks(values []string) ([]node.DiskConfig, error) {
	var disks []node.DiskConfig
	seen := map[string]bool{}
	for i, v := range values {
		name, path, named := strings.Cut(v, "=")
		if !named {
			name, path = fmt.Sprintf("disk-%d", i+1), v
		}
		if name == "" || path == "" {
			return nil, fmt.Errorf("--disk %q: want PATH or NAME=PATH", v)
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			return nil, fmt.Errorf("--disk %q: %w", v, err)
		}
		if seen[name] {
			return nil, fmt.Errorf("--disk %q: disk name %s is used twice", v, name)
		}
		seen[name] = true
		disks = append(disks, node.DiskConfig{Name: name, Path: abs})
	}
	return disks, nil
}

// newClients builds the Kubernetes and Strata clients of one process from a
// kubeconfig file (empty: in-cluster), naming the process in the user agent.
func newClients(kubeconfig, component string) (kubernetes.Interface, versioned.Interface, *rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("kubeconfig: %w", err)
	}
	// The default 5 QPS throttles start-up on a node with many objects.
	cfg.QPS, cfg.Burst = 50, 100
	cfg.UserAgent = component + "/" + Version
	kubeClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	strataClient, err := versioned.NewForConfig(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	return kubeClient, strataClient, cfg, nil
}

func runDaemon(parent context.Context, cfg daemonConfig) error {
	ctx, stop := signal.NotifyContext(parent, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := logrus.WithField("node", cfg.nodeName)
	// Bound before anything connects anywhere: a port chosen free by whoever
	// started us could otherwise be taken as the local port of one of our
	// own outgoing connections.
	lns, err := bindListeners(cfg)
	if err != nil {
		return err
	}
	defer lns.close()
	cfg.webhook.listener = lns.webhook

	kubeClient, strataClient, restConfig, err := newClients(cfg.kubeconfig, "strata-manager")
	if err != nil {
		return err
	}
	if _, err := kubeClient.Discovery().ServerResourcesForGroupVersion(v1beta1.SchemeGroupVersion.String()); err != nil {
		return fmt.Errorf("the API server does not serve %s; are Strata's CRDs (k8s/crds) installed? %w",
			v1beta1.SchemeGroupVersion, err)
	}

	// This node's certificates (app/daemon_tls.go): asked of the CA signer
	// while the caches fill.
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	keeper, err := startCertificates(ctx, &wg, log, kubeClient, cfg)
	if err != nil {
		return err
	}
	managerID := &keeper.Manager

	ds, err := datastore.New(cfg.namespace, strataClient, kubeClient)
	if err != nil {
		return err
	}
	// KubeVirt's and Harvester's kinds, for quotas, once they are installed.
	if err := ds.WatchOptionalKinds(metadata.NewForConfigOrDie(restConfig), dynamic.NewForConfigOrDie(restConfig)); err != nil {
		return err
	}
	broadcaster, recorder := newEventRecorder(kubeClient, cfg.nodeName)
	defer broadcaster.Shutdown()
	kit.SetRetryBackoff(kit.RetryBackoff{BaseDelay: kit.DefaultRetryBackoff.BaseDelay, MaxDelay: cfg.maxRetryDelay})

	// One pooled gRPC connection per instance manager, shared by every
	// controller that reaches the data plane.
	imPool := engineapi.NewPool(engineapi.DefaultTimeout, pki.ClientConfig(managerID, pki.ComponentInstanceManager))
	defer imPool.Close()
	// The instance cache is this node's view of its instance manager, fed
	// by the InstanceManager controller's Watch stream; nil without one.
	var instances *kit.InstanceCache
	// Every controller is registered by one line; they start once the
	// caches have synced (app/controllers.go).
	controllers := &controllerSet{workers: cfg.workers}
	if cfg.imAddress != "" {
		instances = kit.NewInstanceCache()
		controllers.single(instance.NewInstanceManagerController(log, ds, recorder, cfg.nodeName, cfg.imAddress, imPool, instances))
	}
	nodes, err := node.NewNodeController(log, ds, recorder, cfg.nodeName, cfg.disks,
		node.NodeControllerOptions{LeaseDuration: cfg.leaseDuration, DiskCheckInterval: cfg.diskCheckInterval,
			FreeSpaceReportInterval: cfg.freeSpaceReportInterval, Instances: instances, IMAddress: cfg.imAddress,
			DataPlane: imPool, APIAddress: cfg.apiAdvertise})
	controllers.add(nodes, err)
	controllers.single(setting.NewSettingController(log, ds, recorder, cfg.nodeName))
	controllers.add(volume.NewVolumeController(log, ds, recorder, cfg.nodeName))
	controllers.add(quota.NewResourceQuotaController(log, ds, recorder, cfg.nodeName))
	controllers.add(backup.NewBackupTargetController(log, ds, recorder, cfg.nodeName))
	controllers.add(attachment.NewVolumeAttachmentController(log, ds, recorder, cfg.nodeName))
	controllers.add(snapshot.NewSnapshotController(log, ds, recorder, cfg.nodeName, imPool))
	controllers.add(snapshot.NewSnapshotGroupController(log, ds, recorder, cfg.nodeName, imPool))
	controllers.add(volume.NewVolumeCloneController(log, ds, recorder, cfg.nodeName, imPool))
	controllers.add(backup.NewVolumeRestoreController(log, ds, recorder, cfg.nodeName, imPool, instances))
	controllers.add(backup.NewBackupController(log, ds, recorder, cfg.nodeName, imPool, instances))
	controllers.add(backup.NewRecurringJobController(log, ds, recorder, cfg.nodeName, imPool))
	controllers.add(instance.NewEngineController(log, ds, recorder, cfg.nodeName, cfg.imAddress, imPool, instances))
	controllers.add(instance.NewReplicaController(log, ds, recorder, cfg.nodeName, cfg.imAddress, imPool, instances))
	backingImages, err := backingimage.NewBackingImageController(log, ds, recorder, cfg.nodeName, imPool, cfg.uploadLimit,
		pki.ClientConfig(managerID, pki.ComponentManager))
	controllers.add(backingImages, err)
	if cfg.imPodSelector != "" {
		if err := ds.WatchInstanceManagerPods(cfg.imPodSelector); err != nil {
			return fmt.Errorf("--instance-manager-pods: %w", err)
		}
		controllers.single(instance.NewInstanceManagerRolloutController(log, ds, recorder, cfg.nodeName))
	}
	if controllers.err != nil {
		return controllers.err
	}

	// Per-object series of what this manager is responsible for, read from
	// the caches at scrape time (controller/metrics.go).
	legacyregistry.RawMustRegister(controller.NewMetricsCollector(ds, cfg.nodeName))
	// Users' bearer tokens: TokenReview, then a SubjectAccessReview of what
	// each request asks (/metrics, an upload, a REST action).
	kubeAuth := api.NewKubeAuth(kubeClient)
	usersCA, err := startUserClientCA(ctx, &wg, kubeClient, cfg.apiClientCA, log)
	if err != nil {
		return err
	}
	if usersCA != nil {
		kubeAuth.WithClientCertificates(usersCA)
	}
	forCertificateUsers, err := managerWrites(restConfig, usersCA != nil)
	if err != nil {
		return err
	}
	ready := make(chan struct{})
	metricsErr := serveMetrics(ctx, lns.metrics, metricsHandler(imPool, cfg.imAddress), ready, kubeAuth, pki.UserServerConfig(managerID), log)
	// Uploads: a bearer token, TokenReview, SubjectAccessReview of update on the image.
	// Copies between disks: a peer manager's certificate.
	apiHandler := api.NewHandler(backingImages, api.Options{Uploads: kubeAuth, Namespace: cfg.namespace,
		PeerCheck: requirePeer(managerID, pki.ComponentManager), Log: log,
		REST: api.RESTOptions{Auth: kubeAuth, Clients: callerClients(restConfig), Manager: forCertificateUsers,
			Cache: ds, Namespace: cfg.namespace,
			NodeName: cfg.nodeName, DataPlane: imPool, Recorder: recorder}})
	// HTTPS with this manager's certificate; a client certificate is asked
	// for, not required: a peer's (Strata CA) or a user's (cluster client
	// CA), else users send bearer tokens.
	apiErr := serveHTTP(ctx, lns.api, apiHandler, pki.UserOrPeerServerConfig(managerID, usersCA, pki.ComponentManager),
		log.WithField("serving", "API"))

	start := time.Now()
	ds.Start(ctx)
	nodes.StartHeartbeat(ctx) // before the (at scale, long) first list: see StartHeartbeat
	if err := ds.WaitForCacheSync(ctx); err != nil {
		return err
	}
	log.WithField("elapsed", time.Since(start).Round(time.Millisecond)).Info("Caches synced")
	if created, err := ds.EnsureDefaultSettings(ctx); err != nil {
		return fmt.Errorf("creating default settings: %w", err)
	} else if len(created) > 0 {
		log.WithField("settings", created).Info("Created default settings")
	}
	if err := api.ReleaseRevertTickets(ctx, ds, cfg.nodeName, log); err != nil {
		// Not fatal: the Lease lapses in the end (revertTicketTTL).
		log.WithError(err).Warn("Could not release the tickets of reverts this manager was running")
	}
	close(ready)

	if err := waitCertificates(ctx, keeper); err != nil {
		return err
	}
	// Admission webhooks (app/daemon_webhook.go): their rules read the synced caches.
	if err := startWebhook(ctx, &wg, log, ds, kubeClient, keeper, cfg); err != nil {
		return err
	}
	controllers.run(ctx, &wg)
	log.Info("strata-manager is running")

	select {
	case <-ctx.Done():
	case err := <-metricsErr:
		stop()
		wg.Wait()
		return err
	case err := <-apiErr:
		stop()
		wg.Wait()
		return err
	}
	log.Info("Shutting down")
	wg.Wait()
	return nil
}

// Instance-manager calls are counted on /metrics beside the workqueues.
func init() {
	legacyregistry.RawMustRegister(engineapi.Collectors()...)
	legacyregistry.RawMustRegister(backup.BackupDuration, backup.BackupUploadedBytes, backup.BackupFailures)
}

func newEventRecorder(kubeClient kubernetes.Interface, nodeName string) (record.EventBroadcaster, record.EventRecorder) {
	// A scheme of the recorder's own: adding Strata's kinds to client-go's
	// global scheme here raced with the informers already started (the
	// certificate keeper's ConfigMap watch reads that scheme): a fatal
	// "concurrent map read and map write" at a manager's restart.
	scheme := runtime.NewScheme()
	utilruntime.Must(kubescheme.AddToScheme(scheme))
	utilruntime.Must(stratascheme.AddToScheme(scheme))
	broadcaster := record.NewBroadcaster()
	broadcaster.StartStructuredLogging(4)
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kubeClient.CoreV1().Events("")})
	return broadcaster, broadcaster.NewRecorder(scheme, corev1.EventSource{Component: "strata-manager", Host: nodeName})
}

// serveMetrics serves, over HTTPS, /metrics to users RBAC lets get it (a
// bearer token; nonResourceURLs ["/metrics"], as the Kubernetes components
// do), and /healthz and /readyz (ready once caches have synced) to anyone:
// the kubelet's probes carry no token and they tell nothing. Errors after
// start-up arrive on the returned channel.
func serveMetrics(ctx context.Context, ln net.Listener, metrics http.Handler, ready <-chan struct{}, auth api.NonResourceAuth, tlsConfig *tls.Config,
	log logrus.FieldLogger) <-chan error {
	if ln == nil {
		return make(chan error, 1)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", api.RequireNonResource(auth, "/metrics", "get", metrics, log.WithField("serving", "metrics")))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-ready:
			_, _ = w.Write([]byte("ok"))
		default:
			http.Error(w, "caches not synced", http.StatusServiceUnavailable)
		}
	})
	return serveHTTP(ctx, ln, mux, tlsConfig, log.WithField("serving", "metrics and health"))
}

// listeners are the daemon's bound server sockets; nil where disabled.
type listeners struct{ metrics, api, webhook net.Listener }

func bindListeners(cfg daemonConfig) (*listeners, error) {
	l := &listeners{}
	for _, b := range []struct {
		flag, addr string
		ln         *net.Listener
	}{
		{"--metrics-listen", cfg.metricsListen, &l.metrics},
		{"--api-listen", cfg.apiListen, &l.api},
		{"--webhook-listen", cfg.webhook.listen, &l.webhook},
	} {
		if b.addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", b.addr)
		if err != nil {
			l.close()
			return nil, fmt.Errorf("%s %s: %w", b.flag, b.addr, err)
		}
		*b.ln = ln
	}
	return l, nil
}

// close closes the listeners no server took over (a server closes its own).
func (l *listeners) close() {
	for _, ln := range []net.Listener{l.metrics, l.api, l.webhook} {
		if ln != nil {
			_ = ln.Close()
		}
	}
}

// serveHTTP serves handler on ln until ctx ends (nil: serves nothing), over
// TLS with tlsConfig unless it is nil. Errors after start-up arrive on the
// returned channel.
func serveHTTP(ctx context.Context, ln net.Listener, handler http.Handler, tlsConfig *tls.Config, log logrus.FieldLogger) <-chan error {
	errc := make(chan error, 1)
	if ln == nil {
		return errc
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
	}
	log.WithFields(logrus.Fields{"address": ln.Addr().String(), "tls": tlsConfig != nil}).Info("Serving HTTP")
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	return errc
}

// advertiseAddress is the API address peers use: the one given, else the
// listen address, with podIP as its host when it names none.
func advertiseAddress(listen, given, podIP string) (string, error) {
	if given != "" || listen == "" {
		return given, nil
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("--api-listen %q: %w", listen, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = podIP
		if host == "" {
			// A host's name is what peers on a plain network resolve.
			if host, err = os.Hostname(); err != nil {
				return "", fmt.Errorf("--api-listen %q names no host and the host name is unknown (%w): set --api-advertise-address or $POD_IP", listen, err)
			}
		}
	}
	return net.JoinHostPort(host, port), nil
}

// callerClients makes the REST API's clients that act with a caller's
// bearer token, so a write through the API is allowed exactly when the
// caller may make it: the manager's API server address and CA with the
// caller's token and no credential of the manager's
// (rest.AnonymousClientConfig).
func callerClients(managerConfig *rest.Config) api.CallerClients {
	return func(token string) (versioned.Interface, error) {
		return versioned.NewForConfig(callerConfig(managerConfig, token))
	}
}

func callerConfig(managerConfig *rest.Config, token string) *rest.Config {
	cfg := rest.AnonymousClientConfig(managerConfig)
	cfg.BearerToken = token
	cfg.UserAgent = "strata-manager-rest/" + Version
	cfg.QPS, cfg.Burst = 20, 40
	return cfg
}

// managerWrites is the manager's own clientset for the REST writes of
// client certificates' users, made after their access review (api's
// rest_writes.go says why not impersonation), with a user agent of its own
// for the audit log; nil when client certificates are not taken.
func managerWrites(managerConfig *rest.Config, clientCertificates bool) (versioned.Interface, error) {
	if !clientCertificates {
		return nil, nil
	}
	cfg := rest.CopyConfig(managerConfig)
	cfg.UserAgent = "strata-manager-rest-for-certificate-users/" + Version
	cfg.QPS, cfg.Burst = 20, 40
	return versioned.NewForConfig(cfg)
}
