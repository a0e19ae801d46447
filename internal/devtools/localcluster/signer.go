package localcluster

import (
	"context"
	"path/filepath"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/types"
)

// The CA signer of the process mode: one `strata-manager ca-signer`
// process (the chart's Deployment elsewhere), which holds the CA, publishes
// the CA bundle and signs the managers' certificate requests; the managers
// wait for it. It runs as its own ServiceAccount, whose RBAC ships in
// package/manifests (13-rbac-ca-signer.yaml): types.SignerServiceAccount.
// SignerIdentity is the local signer's --identity, its Lease holder name.
const SignerIdentity = "local-signer"

// SignerOptions say how StartSigner runs the CA signer.
type SignerOptions struct {
	Bin        string // strata-manager binary
	Kubeconfig string // the signer ServiceAccount's kubeconfig (Cluster.SignerKubeconfig)
	Namespace  string
	// RunDir holds its log: logs/ca-signer.log (ca-signer-<identity>.log
	// for an identity other than SignerIdentity).
	RunDir string
	// Identity is its --identity; "": SignerIdentity.
	Identity string
	// LeaseDuration is its --lease-duration; 0: the managers' default.
	LeaseDuration time.Duration
	// Args are more flags (e.g. --ca-rotate-before 1h).
	Args []string
}

// SignerOptions are the options of a signer beside these managers: the
// same binary, namespace, run directory and lease duration, authenticated
// with kubeconfig.
func (o ManagerOptions) SignerOptions(kubeconfig string) SignerOptions {
	return SignerOptions{Bin: o.Bin, Kubeconfig: kubeconfig, Namespace: o.Namespace, RunDir: o.RunDir,
		LeaseDuration: o.leaseDuration()}
}

func (o SignerOptions) identity() string {
	if o.Identity == "" {
		return SignerIdentity
	}
	return o.Identity
}

// LogPath is the signer's log (appended to across restarts).
func (o SignerOptions) LogPath() string {
	name := "ca-signer.log"
	if id := o.identity(); id != SignerIdentity {
		name = "ca-signer-" + id + ".log"
	}
	return filepath.Join(o.RunDir, "logs", name)
}

// Signer is a running CA signer process; Stop and Kill are its Process's.
type Signer struct {
	*Process
	Identity string
	opts     SignerOptions
}

// StartSigner starts `<bin> ca-signer` with opts. It returns at once: the
// signer takes its Lease and creates the CA on its own, and the managers
// wait for their certificates meanwhile.
func StartSigner(opts SignerOptions) (*Signer, error) {
	args := []string{"ca-signer",
		"--kubeconfig", opts.Kubeconfig,
		"--namespace", opts.Namespace,
		"--identity", opts.identity(),
		"--lease-duration", leaseOrDefault(opts.LeaseDuration).String(),
	}
	args = append(args, opts.Args...)
	p, err := StartProcess("ca-signer "+opts.identity(), opts.LogPath(), opts.Bin, args...)
	if err != nil {
		return nil, err
	}
	return &Signer{Process: p, Identity: opts.identity(), opts: opts}, nil
}

// Restart starts the signer again, with the same options, after it exited.
func (s *Signer) Restart() (*Signer, error) { return StartSigner(s.opts) }

// SignerKubeconfig writes Dir/kubeconfigs/strata-signer.kubeconfig for the
// signer ServiceAccount of namespace (package/manifests makes it) and
// returns its path.
func (c *Cluster) SignerKubeconfig(ctx context.Context, namespace string) (string, error) {
	path := c.path("kubeconfigs", types.SignerServiceAccount+".kubeconfig")
	return path, c.ServiceAccountKubeconfig(ctx, namespace, types.SignerServiceAccount, path)
}

// SignerSupervisor keeps a signer running, as a Deployment's ReplicaSet
// would: one that exits starts again after a backoff (make run).
type SignerSupervisor struct {
	sup *Supervisor
	mu  sync.Mutex
	s   *Signer
}

const signerComponent = "ca-signer"

// SuperviseSigner watches s until Stop.
func SuperviseSigner(log logrus.FieldLogger, s *Signer) *SignerSupervisor {
	ctx, cancel := context.WithCancel(context.Background())
	ss := &SignerSupervisor{s: s,
		sup: &Supervisor{log: log.WithField("component", signerComponent), restarts: map[string]int{}, stop: cancel}}
	ss.sup.wg.Go(func() {
		ss.sup.keepRunning(ctx, signerComponent, func() *Process { return ss.Signer().Process }, ss.restart)
	})
	return ss
}

// Signer is the current signer process.
func (ss *SignerSupervisor) Signer() *Signer {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.s
}

// Restarts tells how often the signer was restarted.
func (ss *SignerSupervisor) Restarts() int { return ss.sup.Restarts(signerComponent) }

func (ss *SignerSupervisor) restart() (*Process, error) {
	next, err := ss.Signer().Restart()
	if err != nil {
		return nil, err
	}
	ss.mu.Lock()
	ss.s = next
	ss.mu.Unlock()
	return next.Process, nil
}

// Stop ends supervision, then stops the signer.
func (ss *SignerSupervisor) Stop(timeout time.Duration) error {
	ss.sup.stop()
	ss.sup.wg.Wait()
	return ss.Signer().Stop(timeout)
}
