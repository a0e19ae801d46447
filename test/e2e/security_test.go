package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/engine/dataconn"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
	stypes "github.com/strata-storage/strata/types"
)

// strangerAddr is where the stranger's connections come from: another
// loopback address than the one Strata's processes use.
var strangerAddr = net.ParseIP("127.0.0.2")

// credential is what a stranger may hold.
type credential struct {
	name string
	// source is the certificate presented; nil presents none.
	source pki.Source
	// plain speaks no TLS at all.
	plain bool
}

// strangerCredentials: none, a certificate of another CA claiming the
// right identity, and a real Strata certificate of the wrong component
// (stolen from a node).
func strangerCredentials(t *testing.T, rightComponent, stolen string) []credential {
	t.Helper()
	otherCA, err := pki.NewAuthority()
	require.NoError(t, err)
	forged, err := otherCA.Source(pki.Identity{Component: rightComponent, Node: "node-1"})
	require.NoError(t, err)
	creds := []credential{
		{name: "plain TCP", plain: true},
		{name: "TLS without a certificate"},
		{name: "a certificate of another CA naming a " + rightComponent, source: withStrataRoots(t, forged)},
	}
	switch stolen {
	case pki.ComponentInstanceManager:
		// What a stranger who read node-2's instance-manager directory holds.
		creds = append(creds, credential{name: "a stolen instance-manager certificate",
			source: pki.NewDirSource(env.managerOpts.TLSDir("node-2"))})
	case pki.ComponentManager:
		creds = append(creds, credential{name: "a Strata manager certificate", source: identityFromSecret(t, pki.ComponentManager)})
	}
	return creds
}

// withStrataRoots presents src's certificate but trusts Strata's CA, so
// that only the server's verdict on the client is tested.
func withStrataRoots(t *testing.T, src *pki.MemorySource) pki.Source {
	roots, err := identityFromSecret(t, pki.ComponentManager).Roots()
	require.NoError(t, err)
	return rootsOverride{Source: src, roots: roots}
}

type rootsOverride struct {
	pki.Source
	roots *x509.CertPool
}

func (r rootsOverride) Roots() (*x509.CertPool, error) { return r.roots, nil }

// identityFromSecret is an identity an admin can issue from the CA Secret.
func identityFromSecret(t *testing.T, component string) *pki.MemorySource {
	t.Helper()
	src, err := pki.SourceFromSecret(context.Background(), env.adminKube, ns, pki.Identity{Component: component, Node: "e2e"})
	require.NoError(t, err)
	return src
}

func (c credential) tlsConfig(serverComponent string) *tls.Config {
	if c.source == nil {
		return &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12} //nolint:gosec // a stranger's client
	}
	return pki.ClientConfig(c.source, serverComponent)
}

func strangerDialer() *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: strangerAddr}, Timeout: 5 * time.Second}
}

// Nobody who is not Strata gets through (issue 24): the instance manager's
// gRPC, a replica's data port, the NBD export and the upload endpoint each
// refuse a client without Strata's certificates, with a certificate of
// another CA, and with a Strata certificate of the wrong component; the
// volume's data is unchanged afterwards. Each door is also opened once
// with the right key, so the test can tell a refusal from a broken door.
func TestStrangersAreRefused(t *testing.T) {
	ctx := context.Background()
	const volume = "e2e-sec"
	createVolume(t, volume, "16Mi", 2)
	waitVolume(t, volume, time.Minute, "detached", isDetached)
	updateTickets(t, volume, addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	v := waitVolume(t, volume, time.Minute, "served on node-1", servedOn("node-1"))
	qemuIO(t, v.Status.FrontendEndpoint, "write -P 0x5c 0 1M", "flush")
	before := nbdSum(t, v.Status.FrontendEndpoint)

	t.Run("instance-manager gRPC", func(t *testing.T) {
		addr := env.managers["node-1"].IM.GRPCAddr
		call := func(tlsCfg *tls.Config) error {
			c, err := engineapi.NewClient(addr, 5*time.Second, tlsCfg, grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
				return strangerDialer().DialContext(ctx, "tcp", a)
			}))
			require.NoError(t, err)
			defer c.Close()
			_, err = c.InstanceList(ctx)
			return err
		}
		for _, c := range strangerCredentials(t, pki.ComponentManager, pki.ComponentInstanceManager) {
			cfg := c.tlsConfig(pki.ComponentInstanceManager)
			if c.plain {
				cfg = nil
			}
			assert.Error(t, call(cfg), "%s must be refused", c.name)
		}
		assert.NoError(t, call(pki.ClientConfig(identityFromSecret(t, pki.ComponentManager), pki.ComponentInstanceManager)),
			"a manager's certificate opens it")
	})

	t.Run("replica data port", func(t *testing.T) {
		engines, err := env.adminStrata.StrataV1beta1().Engines(ns).List(ctx, metav1.ListOptions{LabelSelector: stypes.LabelVolume + "=" + volume})
		require.NoError(t, err)
		require.Len(t, engines.Items, 1)
		var addr string
		for _, a := range engines.Items[0].Status.CurrentReplicaAddressMap {
			addr = a
		}
		require.NotEmpty(t, addr)
		dial := func(tlsCfg *tls.Config) error {
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			c, err := dataconn.Dial(dctx, addr, dataconn.Options{TLS: tlsCfg, Dialer: strangerDialer(), Timeout: 5 * time.Second})
			if err == nil {
				c.Close()
			}
			return err
		}
		for _, c := range strangerCredentials(t, pki.ComponentInstanceManager, pki.ComponentManager) {
			cfg := c.tlsConfig(pki.ComponentInstanceManager)
			if c.plain {
				cfg = nil
			}
			assert.Error(t, dial(cfg), "%s must be refused", c.name)
		}
		assert.NoError(t, dial(pki.ClientConfig(pki.NewDirSource(env.managerOpts.TLSDir("node-2")), pki.ComponentInstanceManager)),
			"an instance manager's certificate opens it")
	})

	t.Run("NBD export", func(t *testing.T) {
		require.True(t, strings.HasPrefix(v.Status.FrontendEndpoint, "nbd+unix:///"),
			"volumes are served on a unix socket, not TCP: %s", v.Status.FrontendEndpoint)
		// Another user of the node (nobody) cannot open it.
		out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
			"nbdinfo", "--size", v.Status.FrontendEndpoint).CombinedOutput()
		assert.Error(t, err, "nbdinfo as nobody: %s", out)
	})

	t.Run("upload endpoint", func(t *testing.T) {
		const image = "e2e-sec-upload"
		createBackingImage(t, image, v1beta1.BackingImageSpec{SourceType: v1beta1.BackingImageSourceTypeUpload})
		waitBackingImage(t, image, time.Minute, "a UUID", func(bi *v1beta1.BackingImage) bool { return bi.Status.UUID != "" })
		addr := env.managers["node-1"].APIAddr
		put := func(tlsCfg *tls.Config, plain bool) (int, error) {
			scheme := "https://"
			if plain {
				scheme = "http://"
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPut, scheme+addr+"/v1/backingimages/"+image+"/upload",
				strings.NewReader("evil bytes"))
			require.NoError(t, err)
			client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg,
				DialContext: strangerDialer().DialContext}}
			resp, err := client.Do(req)
			if err != nil {
				return 0, err
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
			return resp.StatusCode, nil
		}
		for _, c := range strangerCredentials(t, pki.ComponentManager, pki.ComponentInstanceManager) {
			code, err := put(c.tlsConfig(pki.ComponentManager), c.plain)
			if err == nil {
				assert.Contains(t, []int{http.StatusBadRequest, http.StatusUnauthorized}, code, "%s must be refused", c.name)
			}
		}
		// The peers' route wants a manager's certificate; a user's TLS without one is refused.
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/v1/backingimages/"+image+"/disks/disk-1/file", nil)
		require.NoError(t, err)
		resp, err := (&http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: caBundlePool(t)}, DialContext: strangerDialer().DialContext}}).Do(req)
		require.NoError(t, err, "the API's certificate verifies against the published CA bundle")
		resp.Body.Close()
		assert.Equal(t, http.StatusForbidden, resp.StatusCode)
		bi, err := env.adminStrata.StrataV1beta1().BackingImages(ns).Get(ctx, image, metav1.GetOptions{})
		require.NoError(t, err)
		for disk, st := range bi.Status.DiskFileStatusMap {
			assert.NotEqual(t, v1beta1.BackingImageStateReady, st.State, "disk %s took no stranger's bytes", disk)
		}
	})

	assert.Equal(t, before, nbdSum(t, v.Status.FrontendEndpoint), "the volume's data is unchanged")
}

// caBundlePool is the CA bundle the webhook leader publishes for users.
func caBundlePool(t *testing.T) *x509.CertPool {
	t.Helper()
	var pool *x509.CertPool
	require.Eventually(t, func() bool {
		cm, err := env.adminKube.CoreV1().ConfigMaps(ns).Get(context.Background(), types.CABundleConfigMap, metav1.GetOptions{})
		if err != nil {
			return false
		}
		pool = x509.NewCertPool()
		return pool.AppendCertsFromPEM([]byte(cm.Data[types.CABundleKey]))
	}, 30*time.Second, 100*time.Millisecond, "ConfigMap %s published", types.CABundleConfigMap)
	return pool
}
