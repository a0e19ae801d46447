// Package kubectlstrata is the kubectl plugin `kubectl strata`: Strata's
// REST API from the command line, with the kubeconfig's credentials. The
// strata-manager binary runs it when invoked as kubectl-strata (make build
// links bin/kubectl-strata to it).
package kubectlstrata

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/urfave/cli/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/strata-storage/strata/internal/apiclient"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned"
	"github.com/strata-storage/strata/types"
)

// client reaches one manager's REST API, and the API server for what the
// REST API does not serve (the quota's figures, the nodes).
type client struct {
	http   *http.Client
	base   string // https://host:port
	kube   kubernetes.Interface
	strata versioned.Interface
}

func newClient(ctx context.Context, cmd *cli.Command) (*client, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if k := cmd.String("kubeconfig"); k != "" {
		rules.ExplicitPath = k
	}
	restCfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: cmd.String("context")}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	c := &client{}
	if c.kube, err = kubernetes.NewForConfig(restCfg); err != nil {
		return nil, err
	}
	if c.strata, err = versioned.NewForConfig(restCfg); err != nil {
		return nil, err
	}
	ns := cmd.String("strata-namespace")
	cm, err := c.kube.CoreV1().ConfigMaps(ns).Get(ctx, types.CABundleConfigMap, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading Strata's CA bundle (ConfigMap %s/%s): %w", ns, types.CABundleConfigMap, err)
	}
	if c.base, err = apiBase(ctx, cmd, c.strata, ns); err != nil {
		return nil, err
	}
	apiCfg, err := apiclient.Config(restCfg, []byte(cm.Data[types.CABundleKey]), cmd.String("token"))
	if err != nil {
		return nil, err
	}
	c.http, err = rest.HTTPClientFor(apiCfg)
	return c, err
}

// apiBase is --api, or the API address of a ready Strata node.
func apiBase(ctx context.Context, cmd *cli.Command, strata versioned.Interface, ns string) (string, error) {
	if a := cmd.String("api"); a != "" {
		if u, err := url.Parse(a); err != nil || u.Scheme != "https" || u.Host == "" {
			return "", fmt.Errorf("--api %q: want https://host[:port]", a)
		}
		return strings.TrimSuffix(a, "/"), nil
	}
	nodes, err := strata.StrataV1beta1().Nodes(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("finding a Strata manager (Nodes in %s): %w", ns, err)
	}
	var ptrs []*v1beta1.Node
	for i := range nodes.Items {
		ptrs = append(ptrs, &nodes.Items[i])
	}
	if addr := apiclient.ReadyAddress(ptrs); addr != "" {
		return "https://" + addr, nil
	}
	return "", fmt.Errorf("no ready Strata node in %s serves the API; give --api https://%s.%s.svc", ns, types.APIServiceName, ns)
}

// apiError is the API's JSON error.
type apiError struct {
	Code  int
	Body  map[string]any
	Plain string
}

func (e *apiError) Error() string {
	if msg, ok := e.Body["error"].(string); ok {
		return fmt.Sprintf("%s (HTTP %d)", msg, e.Code)
	}
	return fmt.Sprintf("HTTP %d: %s", e.Code, e.Plain)
}

// call sends in as JSON and decodes the reply into out (when both exist).
func (c *client) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return c.do(req, out)
}

// do sends req and decodes a JSON reply into out; an error status is an
// *apiError.
func (c *client) do(req *http.Request, out any) error {
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	return decodeReply(resp, out)
}

// decodeReply reads a reply: JSON into out, or the API's error.
func decodeReply(resp *http.Response, out any) error {
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		e := &apiError{Code: resp.StatusCode, Plain: strings.TrimSpace(string(raw))}
		_ = json.Unmarshal(raw, &e.Body)
		return e
	}
	if out != nil && len(raw) > 0 {
		return json.Unmarshal(raw, out)
	}
	return nil
}
