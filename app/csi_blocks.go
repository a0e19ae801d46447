package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/strata-storage/strata/api"
	"github.com/strata-storage/strata/csi"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/internal/apiclient"
	"github.com/strata-storage/strata/types"
)

// restBlocks answers the CSI SnapshotMetadata service from a manager's
// REST API (action snapshotBlocks): the controller plugin holds no
// data-plane credentials, and the manager reads the engine, attaching a
// detached volume for the call. It authenticates with the plugin's own
// ServiceAccount token and trusts Strata's CA (ConfigMap
// strata-ca-bundle), both read for each stream: the CA rotates and the
// token file is refreshed. A stream's pages share one client, so one TLS
// handshake.
type restBlocks struct {
	kube      kubernetes.Interface
	ds        *datastore.DataStore
	restCfg   *rest.Config
	namespace string
}

// restBlocksStream is one stream's client and the ready manager it asks.
type restBlocksStream struct {
	client *http.Client
	addr   string
}

// maxBlocksReply bounds what one page's answer may hold: 100,000 extents
// of JSON are far less.
const maxBlocksReply = 32 << 20

func (s *restBlocksStream) Close() { s.client.CloseIdleConnections() }

func (s *restBlocksStream) SnapshotBlocks(ctx context.Context, volume, snapshot, base string, from int64, max int) (csi.BlocksPage, error) {
	client, addr := s.client, s.addr
	body, err := json.Marshal(map[string]any{"snapshot": snapshot, "base": base, "startingOffset": from, "maxResults": max})
	if err != nil {
		return csi.BlocksPage{}, err
	}
	u := "https://" + addr + "/v1/volumes/" + url.PathEscape(volume) + "?action=snapshotBlocks"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return csi.BlocksPage{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return csi.BlocksPage{}, fmt.Errorf("asking the manager at %s: %w", addr, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBlocksReply))
	if err != nil {
		return csi.BlocksPage{}, err
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return csi.BlocksPage{}, fmt.Errorf("%w: %s", csi.ErrBlocksNotFound, data)
	case http.StatusBadRequest:
		return csi.BlocksPage{}, fmt.Errorf("%w: %s", csi.ErrBlocksInvalid, data)
	case http.StatusConflict, http.StatusServiceUnavailable, http.StatusInternalServerError, http.StatusBadGateway:
		// The volume attaching or detaching, a manager without a data
		// plane or an engine gone mid-call: worth asking again.
		return csi.BlocksPage{}, fmt.Errorf("the manager at %s answered %d: %s", addr, resp.StatusCode, data)
	default:
		return csi.BlocksPage{}, fmt.Errorf("%w: the manager at %s answered %d: %s", csi.ErrBlocksRefused, addr, resp.StatusCode, data)
	}
	var reply api.BlocksReply
	if err := json.Unmarshal(data, &reply); err != nil {
		return csi.BlocksPage{}, fmt.Errorf("the manager's answer: %w", err)
	}
	return csi.BlocksPage{VolumeSize: reply.VolumeSize, Extents: reply.Extents, Next: reply.Next}, nil
}

// OpenBlocks makes an HTTP client for the API and picks a ready manager.
func (b *restBlocks) OpenBlocks(ctx context.Context) (csi.BlocksReader, error) {
	nodes, err := b.ds.Nodes.ListRO(labels.Everything())
	if err != nil {
		return nil, err
	}
	addr := apiclient.ReadyAddress(nodes)
	if addr == "" {
		return nil, fmt.Errorf("no ready Strata node serves the API")
	}
	cm, err := b.kube.CoreV1().ConfigMaps(b.namespace).Get(ctx, types.CABundleConfigMap, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading Strata's CA bundle (ConfigMap %s/%s): %w", b.namespace, types.CABundleConfigMap, err)
	}
	cfg, err := apiclient.Config(b.restCfg, []byte(cm.Data[types.CABundleKey]), "")
	if err != nil {
		return nil, err
	}
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	return &restBlocksStream{client: client, addr: addr}, nil
}
