// Package localcluster runs a real Kubernetes control plane (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler) as local processes
// on loopback, for integration tests and `make run`, and on request real
// kubelet nodes beside it (StartNodes: kubelet + containerd + runc, one per
// loopback address). Strata's managers still run as plain processes and reach
// the API server with a kubeconfig.
package localcluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
)

// Options configures Start.
type Options struct {
	// Dir holds etcd data, keys, certificates, kubeconfigs and logs. It is
	// created if missing; what a previous Start left in it is replaced.
	Dir string
	// BinDir holds etcd, kube-apiserver and kube-controller-manager. Empty
	// means: run scripts/build-tools.sh from the repository root.
	BinDir string
	// Namespace is the admin kubeconfig's default namespace; "" means "default".
	Namespace string
	// Log receives progress; nil means logrus' standard logger.
	Log logrus.FieldLogger
	// Audit, when set, makes the API server write an audit log of the
	// requests of the users and groups it names (Cluster.AuditLogPath).
	Audit *AuditOptions
}

// Cluster is a running local control plane.
type Cluster struct {
	Dir             string
	BinDir          string
	AdminKubeconfig string // Dir/admin.kubeconfig, usable with kubectl
	APIServerURL    string // https://127.0.0.1:<port>
	AdminConfig     *rest.Config
	CAData          []byte // PEM that verifies the API server's certificate
	// AuditLogPath is the API server's audit log (Dir/logs/audit.log, JSON
	// lines), "" unless Options.Audit asked for one.
	AuditLogPath string

	audit *AuditOptions

	namespace string     // of the admin kubeconfig
	procs     []*Process // in start order
	nodes     []*Node    // kubelet nodes, stopped before the control plane
	// processNodesMade is set once EnsureProcessNode may have made a bare
	// Node for a process-mode manager: Stop deletes them.
	processNodesMu   sync.Mutex
	processNodesMade bool
	// csiMu guards csiProcs and csiCommands: the CSI supervisor restarts
	// processes while tests and Stop read them.
	csiMu    sync.Mutex
	csiProcs []*Process // CSI plugins and sidecars, stopped before the nodes
	// csiCommands is each CSI process's command line, for RestartCSI.
	csiCommands map[string][]string
	// csiSupervision ends the CSI supervisor (SuperviseCSI), if one runs.
	csiSupervision context.CancelFunc
	csiStopped     bool // Stop has begun: no CSI process starts any more
	ca             *certAuthority
	// kernel settings as they were before the first kubelet changed them
	kernelTunables kernelTunables
	saKey          string // service account signing key
	log            logrus.FieldLogger
	readyz         rest.Interface
}

const (
	apiServerReadyTimeout = 2 * time.Minute // a loaded 2-core machine can be slow
	kcmReadyTimeout       = time.Minute
	stopTimeout           = 15 * time.Second // before SIGKILL
	startAttempts         = 3                // on a port taken between FreePorts and bind
)

var errPortInUse = errors.New("port already in use")

// Start runs etcd, kube-apiserver and kube-controller-manager on free
// loopback ports and returns once the API server's /readyz and the controller
// manager's /healthz answer ok. On error nothing it started is left running.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	log := opts.Log
	if log == nil {
		log = logrus.StandardLogger()
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	binDir := opts.BinDir
	if binDir == "" {
		if binDir, err = BuildTools(ctx, log); err != nil {
			return nil, err
		}
	}
	for _, name := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		if _, err := os.Stat(filepath.Join(binDir, name)); err != nil {
			return nil, fmt.Errorf("control plane binary: %w", err)
		}
	}
	for attempt := 1; ; attempt++ {
		c := &Cluster{Dir: dir, BinDir: binDir, AdminKubeconfig: filepath.Join(dir, "admin.kubeconfig"),
			namespace: opts.Namespace, log: log, audit: opts.Audit}
		started := time.Now()
		err := c.start(ctx)
		if err == nil {
			log.WithFields(logrus.Fields{"apiserver": c.APIServerURL, "kubeconfig": c.AdminKubeconfig,
				"took": time.Since(started).Round(time.Millisecond)}).Info("local control plane is ready")
			return c, nil
		}
		_ = c.Stop()
		if !errors.Is(err, errPortInUse) || attempt == startAttempts {
			return nil, err
		}
		log.WithError(err).Warn("a port was taken by another process; retrying with new ports")
	}
}

func (c *Cluster) start(ctx context.Context) error {
	pki, etcdData, kcmCerts, logs := c.path("pki"), c.path("etcd"), c.path("kcm"), c.path("logs")
	for _, d := range []string{pki, etcdData, kcmCerts} {
		// A previous run's etcd data carries old peer URLs and old keys.
		if err := os.RemoveAll(d); err != nil {
			return err
		}
	}
	for _, d := range []string{pki, etcdData, kcmCerts} { // keys and data: owner only
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return err
	}
	ports, err := FreePorts(5)
	if err != nil {
		return err
	}
	etcdClient, etcdPeer, apiPort, kcmPort, schedulerPort := ports[0], ports[1], ports[2], ports[3], ports[4]

	c.saKey = filepath.Join(pki, "service-account.key")
	if err := writeServiceAccountKey(c.saKey); err != nil {
		return err
	}
	if c.ca, err = newCertAuthority(pki); err != nil {
		return err
	}
	kubeletClient := filepath.Join(pki, "apiserver-kubelet-client")
	// system:masters: the API server may do anything on a kubelet (logs, exec).
	if _, _, err := c.ca.issue(kubeletClient, certRequest{CommonName: "kube-apiserver-kubelet-client",
		Groups: []string{"system:masters"}}); err != nil {
		return err
	}
	tokenFile := filepath.Join(pki, "tokens.csv")
	token, err := writeAdminToken(tokenFile)
	if err != nil {
		return err
	}

	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
	if err := c.run("etcd",
		"--name=strata-local",
		"--data-dir="+etcdData,
		"--listen-client-urls="+etcdURL,
		"--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=strata-local="+peerURL,
		"--unsafe-no-fsync", // test data: durability is not worth the latency
		"--log-level=warn",
	); err != nil {
		return err
	}

	var auditFlags []string
	if c.audit != nil {
		if auditFlags, err = c.auditFlags(*c.audit); err != nil {
			return err
		}
	}
	// The API server retries etcd until it answers, so it need not wait for it.
	c.APIServerURL = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	if err := c.run("kube-apiserver", append([]string{
		"--etcd-servers=" + etcdURL,
		"--cert-dir=" + pki,
		fmt.Sprintf("--secure-port=%d", apiPort),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + c.saKey,
		"--service-account-signing-key-file=" + c.saKey,
		"--service-account-max-token-expiration=" + maxTokenTTL.String(),
		"--token-auth-file=" + tokenFile,
		// Kubelets authenticate with certificates from our CA; the Node
		// authorizer and NodeRestriction limit each to its own Node and Pods.
		"--client-ca-file=" + filepath.Join(pki, "ca.crt"),
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true", // Strata's node Pods are privileged
		"--kubelet-client-certificate=" + kubeletClient + ".crt",
		"--kubelet-client-key=" + kubeletClient + ".key",
		"--kubelet-certificate-authority=" + filepath.Join(pki, "ca.crt"),
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		// The default reconciler publishes 127.0.0.1 as the kubernetes
		// Service's endpoint, which validation rejects every 10s.
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false", // less memory, faster start; no contention here
		"--profiling=false",
	}, auditFlags...)...); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "kube-apiserver /readyz", apiServerReadyTimeout, func(ctx context.Context) error {
		return c.apiServerReady(ctx, token)
	}); err != nil {
		return err
	}
	if err := writeKubeconfig(c.AdminKubeconfig, c.APIServerURL, c.CAData, "strata-admin", token, c.namespace); err != nil {
		return err
	}

	if err := c.run("kube-controller-manager",
		"--kubeconfig="+c.AdminKubeconfig,
		// Every default controller (DaemonSets, ReplicaSets, the service
		// account token and root CA publishers Pods need), each under its own
		// service account as in a real cluster.
		"--controllers=*",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+c.saKey,
		"--root-ca-file="+filepath.Join(pki, "apiserver.crt"),
		// Not the default under /usr/libexec, which it would create.
		"--flex-volume-plugin-dir="+kcmCerts,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", kcmPort),
		"--cert-dir="+kcmCerts,
		"--profiling=false",
	); err != nil {
		return err
	}
	if err := c.run("kube-scheduler",
		"--kubeconfig="+c.AdminKubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", schedulerPort),
		"--profiling=false",
	); err != nil {
		return err
	}
	for name, port := range map[string]int{"kube-controller-manager": kcmPort, "kube-scheduler": schedulerPort} {
		healthz := fmt.Sprintf("https://127.0.0.1:%d/healthz", port)
		if err := c.waitFor(ctx, name+" /healthz", kcmReadyTimeout, func(ctx context.Context) error {
			return httpOK(ctx, healthz)
		}); err != nil {
			return err
		}
	}
	return nil
}

// apiServerReady reads the CA the API server generated for itself (it is
// written before the server listens) and asks /readyz with the admin token.
func (c *Cluster) apiServerReady(ctx context.Context, token string) error {
	if c.AdminConfig == nil {
		ca, err := os.ReadFile(filepath.Join(c.Dir, "pki", "apiserver.crt"))
		if err != nil {
			return err
		}
		c.CAData = ca
		c.AdminConfig = restConfig(c.APIServerURL, ca, token)
		dc, err := discovery.NewDiscoveryClientForConfig(c.AdminConfig)
		if err != nil {
			return err
		}
		c.readyz = dc.RESTClient()
	}
	body, err := c.readyz.Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(body))
	}
	return nil
}

// httpOK is a liveness probe against a self-signed loopback endpoint; the
// certificate is not checked because nothing secret is exchanged.
func httpOK(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

// run starts one control plane binary with its log in Dir/logs/<name>.log.
func (c *Cluster) run(name string, args ...string) error {
	logPath := c.path("logs", name+".log")
	_ = os.Remove(logPath) // a retry must not see the previous attempt's errors
	p, err := StartProcess(name, logPath, filepath.Join(c.BinDir, name), args...)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	c.log.WithFields(logrus.Fields{"process": name, "pid": p.Pid(), "log": logPath}).Debug("started")
	return nil
}

// waitFor polls check until it succeeds, fails if timeout or ctx ends first,
// and fails at once, with the tail of its log, if a started process exits.
func (c *Cluster) waitFor(ctx context.Context, what string, timeout time.Duration, check func(context.Context) error) error {
	return waitUntil(ctx, what, timeout, c.procs, check)
}

// waitForProcess is waitFor that also fails at once if p exits.
func (c *Cluster) waitForProcess(ctx context.Context, p *Process, what string, timeout time.Duration, check func(context.Context) error) error {
	return waitUntil(ctx, what, timeout, append(c.Processes(), p), check)
}

func waitUntil(ctx context.Context, what string, timeout time.Duration, procs []*Process, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		for _, p := range procs {
			if p.Exited() {
				tail := p.LogTail(30)
				err := fmt.Errorf("%s exited early (%v); last lines of %s:\n%s", p.Name, p.Err(), p.LogPath, tail)
				if strings.Contains(tail, "address already in use") {
					err = fmt.Errorf("%w: %w", errPortInUse, err)
				}
				return err
			}
		}
		checkCtx, checkCancel := context.WithTimeout(ctx, 5*time.Second)
		lastErr = check(checkCtx)
		checkCancel()
		if lastErr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last error: %v)", what, ctx.Err(), lastErr)
		case <-tick.C:
		}
	}
}

// Stop tears down every kubelet node (their Pods, mounts and cgroups
// included) and deletes the process-mode managers' bare Nodes (stop those
// managers first: their tokens end with their Nodes), then ends every
// process Start started, newest first (SIGTERM, then SIGKILL after a
// timeout). It is safe to call more than once.
func (c *Cluster) Stop() error {
	var errs []error
	c.csiMu.Lock()
	c.csiStopped = true
	if c.csiSupervision != nil {
		c.csiSupervision()
	}
	csiProcs := slices.Clone(c.csiProcs)
	c.csiMu.Unlock()
	// The node plugins first: their volumes' mounts go with the nodes'.
	for i := len(csiProcs) - 1; i >= 0; i-- {
		errs = append(errs, csiProcs[i].Stop(stopTimeout))
	}
	errs = append(errs, c.StopNodes())
	c.deleteProcessNodesAtStop()
	for i := len(c.procs) - 1; i >= 0; i-- {
		if err := c.procs[i].Stop(stopTimeout); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Processes returns the control plane processes, in start order.
func (c *Cluster) Processes() []*Process { return append([]*Process(nil), c.procs...) }

func (c *Cluster) path(elem ...string) string {
	return filepath.Join(append([]string{c.Dir}, elem...)...)
}

// RepoRoot returns the nearest directory at or above the working directory
// that holds a go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod in the working directory or above it")
		}
		dir = parent
	}
}

// BuildTools runs scripts/build-tools.sh, which builds the control plane
// binaries (or the named tools) once per machine (minutes) and otherwise just
// prints where they are. Its progress is logged line by line.
func BuildTools(ctx context.Context, log logrus.FieldLogger, names ...string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(root, "scripts", "build-tools.sh")}, names...)...)
	cmd.Dir = root
	// Cancelling must also stop the `go build` the script runs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	var lastLines []string
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		log.WithField("script", "build-tools.sh").Info(sc.Text())
		lastLines = append(lastLines, sc.Text())
		if len(lastLines) > 20 {
			lastLines = lastLines[1:]
		}
	}
	if err := cmd.Wait(); err != nil {
		return "", fmt.Errorf("scripts/build-tools.sh: %w\n%s", err, strings.Join(lastLines, "\n"))
	}
	out := strings.Fields(stdout.String())
	if len(out) == 0 {
		return "", errors.New("scripts/build-tools.sh printed no bin directory")
	}
	return out[len(out)-1], nil
}
