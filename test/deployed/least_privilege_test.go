package deployed

import (
	"context"
	"crypto/tls"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/types"
)

// The managers' token, which sits on every node in a root host-network
// container, opens no door beyond Strata's own (issue 46): it impersonates
// nobody (system:masters least of all), lists no Secret and reads none but
// the backup credentials it names — not the CA Secret, which only the CA
// signer reads — and creates no webhook configuration (the chart creates
// Strata's two; the token may only patch those).
func testManagerTokenOpensNoOtherDoor(t *testing.T) {
	logsOnFailure(t)
	ctx := context.Background()
	ttl := int64(10 * time.Minute / time.Second)
	tr, err := env.kube.CoreV1().ServiceAccounts(types.DefaultNamespace).CreateToken(ctx, types.ManagerServiceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl}}, metav1.CreateOptions{})
	require.NoError(t, err)
	managerConfig := rest.AnonymousClientConfig(env.cluster.AdminConfig)
	managerConfig.BearerToken = tr.Status.Token
	manager := kubernetes.NewForConfigOrDie(managerConfig)
	as := func(user string, groups ...string) kubernetes.Interface {
		cfg := rest.CopyConfig(managerConfig)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
		return kubernetes.NewForConfigOrDie(cfg)
	}
	listSecrets := func(c kubernetes.Interface, namespace string) func() error {
		return func() error {
			_, err := c.CoreV1().Secrets(namespace).List(ctx, metav1.ListOptions{})
			return err
		}
	}
	webhook := func(name string) func() error {
		return func() error {
			_, err := manager.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx,
				&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
			return err
		}
	}
	for _, tc := range []struct {
		name      string
		call      func() error
		forbidden bool
	}{
		{"impersonate system:masters", listSecrets(as("x", "system:masters"), ""), true},
		{"impersonate a user", listSecrets(as("kubernetes-admin"), ""), true},
		{"impersonate the CSI controller", listSecrets(as("system:serviceaccount:strata-system:strata-csi-controller"), types.DefaultNamespace), true},
		{"list every Secret", listSecrets(manager, ""), true},
		{"list Strata's Secrets", listSecrets(manager, types.DefaultNamespace), true},
		{"read a Secret it does not name", func() error {
			_, err := manager.CoreV1().Secrets("kube-system").Get(ctx, "bootstrap-token-abcdef", metav1.GetOptions{})
			return err
		}, true},
		{"read the CA Secret (the signer's alone)", func() error {
			_, err := manager.CoreV1().Secrets(types.DefaultNamespace).Get(ctx, pki.CASecretName, metav1.GetOptions{})
			return err
		}, true},
		{"read the CA bundle it trusts", func() error {
			_, err := manager.CoreV1().ConfigMaps(types.DefaultNamespace).Get(ctx, types.CABundleConfigMap, metav1.GetOptions{})
			return err
		}, false},
		{"create a webhook configuration", webhook("strata-evil"), true},
		{"create Strata's own webhook configuration", webhook("strata-validator"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if tc.forbidden {
				assert.True(t, apierrors.IsForbidden(err), "want Forbidden, got %v", err)
				return
			}
			assert.NoError(t, err)
		})
	}
}

// Every Strata container runs as the chart says (issue 46), read from the
// kernel's view of its processes on the nodes (/proc/<pid>/status of the
// processes in the kubelet's cgroups): the runtime's seccomp filter, no
// new privileges and no capability for the unprivileged ones, a user that
// is not root where no host directory is touched; the two privileged
// containers (the CSI node plugin; the instance manager with FUSE files)
// are the chart's documented exceptions and are not checked here.
func testComponentsRunConfined(t *testing.T) {
	procs := hostProcesses(t)
	for _, tc := range []struct {
		name    string
		cmdline *regexp.Regexp
		nonRoot bool
	}{
		{"manager", regexp.MustCompile(`strata-manager\x00daemon\x00`), false},
		{"CSI controller plugin", regexp.MustCompile(`strata-manager\x00csi\x00--mode=controller`), true},
		{"CA signer", signerCmdline, true},
		{"csi-provisioner", regexp.MustCompile(`(^|/)csi-provisioner\x00`), true},
		{"csi-attacher", regexp.MustCompile(`(^|/)csi-attacher\x00`), true},
		{"csi-snapshotter", regexp.MustCompile(`(^|/)csi-snapshotter\x00`), true},
		{"csi-snapshot-metadata", regexp.MustCompile(`(^|/)csi-snapshot-metadata\x00`), true},
		{"snapshot-controller", regexp.MustCompile(`(^|/)snapshot-controller\x00`), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var seen int
			for _, p := range procs {
				if !p.inPod || !tc.cmdline.MatchString(p.cmdline) {
					continue
				}
				seen++
				assert.Equal(t, "2", p.status["Seccomp"], "pid %d: seccomp filter mode", p.pid)
				assert.Equal(t, "1", p.status["NoNewPrivs"], "pid %d", p.pid)
				assert.Equal(t, "0000000000000000", p.status["CapEff"], "pid %d: effective capabilities", p.pid)
				uids := strings.Fields(p.status["Uid"])
				require.Len(t, uids, 4, "pid %d", p.pid)
				for _, uid := range uids {
					assert.Equal(t, tc.nonRoot, uid != "0", "pid %d: uids %v", p.pid, uids)
				}
			}
			assert.NotZero(t, seen, "no process of %s found in the kubelet's cgroups", tc.name)
		})
	}
}

// Node A's real instance-manager certificate (issued by node A's manager,
// read from node A's hostDir/tls) served at node B's address is refused by
// the clients that dial instance managers — the managers' gRPC client and
// an engine's data connection — though the CA signed it and it names the
// right component (issue 46); node B's own instance manager is accepted.
func testAnotherNodesCertificateIsRefused(t *testing.T) {
	logsOnFailure(t)
	ctx := context.Background()
	endpoints := instanceManagerEndpoints(t)
	nodeA, nodeB := env.nodes[0], env.nodes[1]
	hostB, _, err := net.SplitHostPort(endpoints[nodeB])
	require.NoError(t, err)
	// An impostor on node B's address with node A's certificate.
	nodeACert := pki.NewDirSource(tlsDir(t, nodeA))
	ln, err := tls.Listen("tcp", net.JoinHostPort(hostB, "0"), pki.ServerConfig(nodeACert, pki.ComponentManager, pki.ComponentInstanceManager))
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _ = c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	impostor := ln.Addr().String()

	manager, err := pki.SourceFromSecret(ctx, env.kube, ns, pki.Identity{Component: pki.ComponentManager, Node: nodeB})
	require.NoError(t, err)
	call := func(endpoint string) error {
		c, err := engineapi.NewClient(endpoint, 10*time.Second, pki.ClientConfig(manager, pki.ComponentInstanceManager))
		require.NoError(t, err)
		defer c.Close()
		_, err = c.InstanceList(ctx)
		return err
	}
	require.NoError(t, call(endpoints[nodeB]), "node B's instance manager at %s", endpoints[nodeB])
	err = call(impostor)
	require.Error(t, err, "node A's certificate at node B's address")
	assert.Contains(t, err.Error(), "another node's certificate")

	engine, err := pki.SourceFromSecret(ctx, env.kube, ns, pki.Identity{Component: pki.ComponentInstanceManager, Node: nodeB})
	require.NoError(t, err)
	raw, err := net.Dial("tcp", impostor)
	require.NoError(t, err)
	defer raw.Close()
	err = tls.Client(raw, pki.ForAddress(pki.ClientConfig(engine, pki.ComponentInstanceManager), impostor)).Handshake()
	require.Error(t, err, "an engine's data connection to node B's address")
	assert.Contains(t, err.Error(), "strata://instance-manager/"+nodeA)
}
