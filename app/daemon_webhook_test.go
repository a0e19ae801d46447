package app

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v3"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/types"
)

func TestWebhookFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    webhookOptions
		wantErr string
	}{
		{name: "defaults", want: webhookOptions{listen: ":9443"}},
		{name: "local mode", args: []string{"--webhook-listen", "127.0.0.1:4443", "--webhook-url-host", "127.0.0.1"},
			want: webhookOptions{listen: "127.0.0.1:4443", urlHost: "127.0.0.1"}},
		{name: "disabled", args: []string{"--webhook-listen", ""}, want: webhookOptions{listen: ""}},
		{name: "the CA is the signer's", args: []string{"--webhook-ca-rotate-before", "240h"},
			wantErr: "flag provided but not defined: -webhook-ca-rotate-before"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got webhookOptions
			cmd := &cli.Command{Name: "daemon", Flags: webhookFlags(),
				Action: func(_ context.Context, cmd *cli.Command) error { got = webhookOptionsFrom(cmd); return nil }}
			err := cmd.Run(context.Background(), append([]string{"daemon"}, tc.args...))
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestStartWebhook(t *testing.T) {
	env := dstest.New(t, nil, nil)
	log := logrus.New()
	cfg := daemonConfig{nodeName: "node-1", namespace: types.DefaultNamespace, leaseDuration: 3 * time.Second}
	keeper, err := pki.NewKeeper(log, env.Kube, pki.KeeperOptions{Namespace: cfg.namespace, Node: cfg.nodeName})
	require.NoError(t, err)
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); wg.Wait() }()

	t.Run("disabled starts nothing", func(t *testing.T) {
		require.NoError(t, startWebhook(ctx, &wg, log, env.DS, env.Kube, keeper, cfg))
	})
	t.Run("an address without a port is refused at start", func(t *testing.T) {
		bad := cfg
		bad.webhook.listen = "127.0.0.1"
		err := startWebhook(ctx, &wg, log, env.DS, env.Kube, keeper, bad)
		assert.EqualError(t, err, `--webhook-listen "127.0.0.1": address 127.0.0.1: missing port in address`)
	})
	t.Run("a free address starts the webhook until the context ends", func(t *testing.T) {
		good := cfg
		good.webhook.listen = "127.0.0.1:0"
		require.NoError(t, startWebhook(ctx, &wg, log, env.DS, env.Kube, keeper, good))
	})
}
