package localcluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
)

var volumeResource = schema.GroupVersionResource{Group: "strata.io", Version: "v1beta1", Resource: "volumes"}

// WaitForWebhooks waits until the API server admits Strata volumes through
// the managers' webhooks: a leader has written the configurations and the
// manager they point at answers. It probes with a server-side dry run, which
// stores nothing: the answer either carries the finalizer only the mutating
// webhook adds, or is a denial from a webhook (for example while too few
// nodes have registered for the probe's single replica).
func (c *Cluster) WaitForWebhooks(ctx context.Context, namespace string, timeout time.Duration) error {
	dyn, err := dynamic.NewForConfig(c.AdminConfig)
	if err != nil {
		return err
	}
	probe := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "strata.io/v1beta1", "kind": "Volume",
		"metadata": map[string]any{"name": "webhook-probe", "namespace": namespace},
		"spec":     map[string]any{"size": "1Mi", "numberOfReplicas": int64(1)},
	}}
	var last string
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		got, err := dyn.Resource(volumeResource).Namespace(namespace).Create(ctx, probe,
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		switch {
		case err == nil && slices.Contains(got.GetFinalizers(), "strata.io/cleanup"):
			return true, nil
		case err == nil:
			last = "admitted without the webhooks (no configuration yet)"
		case strings.Contains(err.Error(), "denied the request"):
			return true, nil
		default:
			last = err.Error()
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("the admission webhooks do not answer after %s: %s", timeout, last)
	}
	return nil
}

var nodeResource = schema.GroupVersionResource{Group: "strata.io", Version: "v1beta1", Resource: "nodes"}

// WaitForNodesReady waits until every named Strata Node CR reports Ready:
// volume validation counts nodes, and scheduling needs them.
func (c *Cluster) WaitForNodesReady(ctx context.Context, namespace string, names []string, timeout time.Duration) error {
	return c.waitForNodeCondition(ctx, namespace, names, "Ready", timeout)
}

// WaitForNodesSchedulable waits until every named Strata Node's disks take
// replicas (their size is known): a claim made earlier waits for them.
func (c *Cluster) WaitForNodesSchedulable(ctx context.Context, namespace string, names []string, timeout time.Duration) error {
	return c.waitForNodeCondition(ctx, namespace, names, "Schedulable", timeout)
}

func (c *Cluster) waitForNodeCondition(ctx context.Context, namespace string, names []string, condType string,
	timeout time.Duration) error {
	dyn, err := dynamic.NewForConfig(c.AdminConfig)
	if err != nil {
		return err
	}
	var pending []string
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		pending = pending[:0]
		for _, n := range names {
			node, err := dyn.Resource(nodeResource).Namespace(namespace).Get(ctx, n, metav1.GetOptions{})
			if err != nil || !conditionTrue(node, condType) {
				pending = append(pending, n)
			}
		}
		return len(pending) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("nodes not %s after %s: %v", condType, timeout, pending)
	}
	return nil
}

func conditionTrue(obj *unstructured.Unstructured, condType string) bool {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if ok && m["type"] == condType && m["status"] == "True" {
			return true
		}
	}
	return false
}
