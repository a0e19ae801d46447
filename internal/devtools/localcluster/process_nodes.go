package localcluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Process nodes: a manager that runs as a process of the host (node-1,
// node-2, …: the end-to-end suite, make run --processes, bench-scale) asks
// the CA signer for its certificates with a token bound to the Node of its
// name, as a manager Pod's projected token is bound to its Pod's Node: the
// API server records the Node's name in the token's extra
// (authentication.kubernetes.io/node-name), and the signer signs only that
// node's identities. Such a node has no kubelet, so the local cluster
// makes a bare Node object for it, on which nothing is ever scheduled.
const (
	// ProcessNodeLabel marks the bare Nodes the local cluster made for
	// process-mode managers (value "true"): DeleteProcessNodes deletes them
	// by it, and tests that mean the kubelet nodes leave them out with
	// KubeletNodeSelector.
	ProcessNodeLabel = "strata.io/process-node"
	// NoKubeletTaint is the key of the taints (NoSchedule and NoExecute)
	// that keep every Pod off a process Node, DaemonSet Pods included (the
	// DaemonSet controller tolerates spec.unschedulable, not this).
	NoKubeletTaint = "strata.io/no-kubelet"
	// KubeletNodeSelector is the label selector of every Node but the
	// process Nodes: the ones a kubelet runs.
	KubeletNodeSelector = "!" + ProcessNodeLabel
	// processNodeTimeout bounds one process Node's creation and its token.
	processNodeTimeout = time.Minute
)

// processNode is the bare Node of a process-mode manager: unschedulable,
// tainted against every Pod, and labelled as the local cluster's.
func processNode(name string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{ProcessNodeLabel: "true"}},
		Spec: corev1.NodeSpec{
			Unschedulable: true,
			Taints: []corev1.Taint{
				{Key: NoKubeletTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule},
				{Key: NoKubeletTaint, Value: "true", Effect: corev1.TaintEffectNoExecute},
			},
		},
	}
}

// IsProcessNode says whether n is a bare Node made for a process-mode
// manager.
func IsProcessNode(n *corev1.Node) bool { return n.Labels[ProcessNodeLabel] == "true" }

// EnsureProcessNode returns the Node named name, first creating it as a
// bare process Node if there is none. A Node that exists (a kubelet's, or
// one an earlier call made) is returned as it is.
func (c *Cluster) EnsureProcessNode(ctx context.Context, name string) (*corev1.Node, error) {
	cs, err := kubernetes.NewForConfig(c.AdminConfig)
	if err != nil {
		return nil, err
	}
	c.processNodesMu.Lock()
	c.processNodesMade = true // before the create: Stop must look even if its answer is lost
	c.processNodesMu.Unlock()
	n, created, err := ensureProcessNode(ctx, cs, name)
	if err != nil {
		return nil, err
	}
	if created {
		c.log.WithFields(logrus.Fields{"node": name, "uid": n.UID}).
			Info("created a bare Node (no kubelet, nothing scheduled) for a process-mode manager's token")
	}
	return n, nil
}

func ensureProcessNode(ctx context.Context, cs kubernetes.Interface, name string) (*corev1.Node, bool, error) {
	nodes := cs.CoreV1().Nodes()
	n, err := nodes.Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		return n, false, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, false, fmt.Errorf("node %s: %w", name, err)
	}
	n, err = nodes.Create(ctx, processNode(name), metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		n, err = nodes.Get(ctx, name, metav1.GetOptions{})
		return n, false, err
	}
	if err != nil {
		return nil, false, fmt.Errorf("creating process node %s: %w", name, err)
	}
	return n, true, nil
}

// NodeBoundServiceAccountKubeconfig is ServiceAccountKubeconfig with the
// token bound to the Node named node (a TokenRequest's boundObjectRef,
// with the Node's UID), which is made a bare process Node first if it does
// not exist. The token stops working when that Node is deleted.
func (c *Cluster) NodeBoundServiceAccountKubeconfig(ctx context.Context, namespace, name, node, path string) error {
	n, err := c.EnsureProcessNode(ctx, node)
	if err != nil {
		return err
	}
	return c.serviceAccountKubeconfig(ctx, namespace, name, path,
		&authenticationv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: n.Name, UID: n.UID})
}

// NodeKubeconfigPath is where NodeKubeconfigs writes node's kubeconfig of
// the ServiceAccount name.
func (c *Cluster) NodeKubeconfigPath(name, node string) string {
	return c.path("kubeconfigs", name+"@"+node+".kubeconfig")
}

// NodeKubeconfigs returns a ManagerOptions.NodeKubeconfig for the
// ServiceAccount namespace/name: at each start of a node's manager it
// writes NodeKubeconfigPath(name, node) with a fresh token bound to that
// node's Node (NodeBoundServiceAccountKubeconfig), so a manager restarted
// after the previous token's TTL still authenticates.
func (c *Cluster) NodeKubeconfigs(namespace, name string) func(node string) (string, error) {
	return func(node string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), processNodeTimeout)
		defer cancel()
		path := c.NodeKubeconfigPath(name, node)
		if err := c.NodeBoundServiceAccountKubeconfig(ctx, namespace, name, node, path); err != nil {
			return "", err
		}
		return path, nil
	}
}

// DeleteProcessNodes deletes every process Node (ProcessNodeLabel), which
// also ends the tokens bound to them: for a cluster that outlives the
// process-mode managers. Stop calls it too.
func (c *Cluster) DeleteProcessNodes(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(c.AdminConfig)
	if err != nil {
		return err
	}
	deleted, err := deleteProcessNodes(ctx, cs)
	if len(deleted) > 0 {
		c.log.WithField("nodes", deleted).Info("deleted the process-mode managers' bare Nodes")
	}
	return err
}

func deleteProcessNodes(ctx context.Context, cs kubernetes.Interface) ([]string, error) {
	list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: ProcessNodeLabel + "=true"})
	if err != nil {
		return nil, fmt.Errorf("listing process nodes: %w", err)
	}
	var deleted []string
	var errs []error
	for _, n := range list.Items {
		err := cs.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{})
		switch {
		case err == nil:
			deleted = append(deleted, n.Name)
		case !apierrors.IsNotFound(err):
			errs = append(errs, fmt.Errorf("deleting process node %s: %w", n.Name, err))
		}
	}
	return deleted, errors.Join(errs...)
}

// deleteProcessNodesAtStop is Stop's part: the process Nodes go while the
// API server still runs, if any was made. A failure is only logged: the
// cluster's data goes with it.
func (c *Cluster) deleteProcessNodesAtStop() {
	c.processNodesMu.Lock()
	made := c.processNodesMade
	c.processNodesMade = false
	c.processNodesMu.Unlock()
	if !made || c.AdminConfig == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.DeleteProcessNodes(ctx); err != nil {
		c.log.WithError(err).Warn("deleting the process nodes before the control plane stops")
	}
}
