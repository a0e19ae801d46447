package api

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned"
	"github.com/strata-storage/strata/types"
)

// A client certificate's user writes through the REST API with the
// manager's rights, only after the user's own access review of that verb
// and object passed, and the write names the user: the object's
// strata.io/requested-by annotation and an event (none for a
// ResourceQuota in a user's namespace, where the manager records no
// events). The manager never impersonates (issue 46).
func TestCertificateUsersWriteWithTheManagersRights(t *testing.T) {
	const bob = "bob"
	written := func(get func(versioned.Interface) (metav1.Object, error)) func(*testing.T, versioned.Interface) {
		return func(t *testing.T, strata versioned.Interface) {
			obj, err := get(strata)
			require.NoError(t, err)
			assert.Equal(t, bob, obj.GetAnnotations()[types.AnnotationRequestedBy])
		}
	}
	volume := func(name string) func(versioned.Interface) (metav1.Object, error) {
		return func(s versioned.Interface) (metav1.Object, error) {
			return s.StrataV1beta1().Volumes(restNS).Get(context.Background(), name, metav1.GetOptions{})
		}
	}
	gone := func(t *testing.T, strata versioned.Interface) {
		_, err := volume("v2")(strata)
		assert.True(t, apierrors.IsNotFound(err), "v2 deleted: %v", err)
	}
	notWritten := func(t *testing.T, strata versioned.Interface) {
		_, err := volume("v9")(strata)
		assert.True(t, apierrors.IsNotFound(err), "nothing written: %v", err)
		rq, err := strata.StrataV1beta1().ResourceQuotas("apps").List(context.Background(), metav1.ListOptions{})
		require.NoError(t, err)
		assert.Empty(t, rq.Items, "nothing written")
	}
	tests := []struct {
		name, method, path, body string
		verbs                    map[string]bool // bob's; nil: all
		wantCode                 int
		wantError, wantEvent     string
		check                    func(*testing.T, versioned.Interface)
	}{
		{name: "create a volume", method: "POST", path: "/v1/volumes", body: `{"name":"v9","size":"1Gi"}`, wantCode: 201,
			wantEvent: "WrittenForUser created for bob (client certificate)", check: written(volume("v9"))},
		{name: "create a volume without create", method: "POST", path: "/v1/volumes", body: `{"name":"v9","size":"1Gi"}`,
			verbs: map[string]bool{"get": true, "list": true}, wantCode: 403,
			wantError: `may not create volumes.strata.io "v9"`, check: notWritten},
		{name: "delete a volume", method: "DELETE", path: "/v1/volumes/v2", wantCode: 204,
			wantEvent: "WrittenForUser deleted for bob", check: gone},
		{name: "expand a volume", method: "POST", path: "/v1/volumes/v1?action=expand", body: `{"size":"2Gi"}`, wantCode: 200,
			wantEvent: "WrittenForUser expanded to 2Gi for bob", check: written(volume("v1"))},
		{name: "snapshot a volume", method: "POST", path: "/v1/volumes/v1?action=snapshotCRCreate", body: `{"name":"s9"}`, wantCode: 200,
			wantEvent: "WrittenForUser created for bob", check: written(func(s versioned.Interface) (metav1.Object, error) {
				return s.StrataV1beta1().Snapshots(restNS).Get(context.Background(), "s9", metav1.GetOptions{})
			})},
		{name: "a first quota in a user's namespace", method: "POST", path: "/v1/namespaces/apps?action=updateResourceQuota",
			body: `{"totalSnapshotSizeQuota":"1Gi"}`, wantCode: 200,
			check: written(func(s versioned.Interface) (metav1.Object, error) {
				return s.StrataV1beta1().ResourceQuotas("apps").Get(context.Background(), v1beta1.DefaultResourceQuotaName, metav1.GetOptions{})
			})},
		{name: "a first quota needs create, not only update", method: "POST", path: "/v1/namespaces/apps?action=updateResourceQuota",
			body: `{"totalSnapshotSizeQuota":"1Gi"}`, verbs: map[string]bool{"update": true}, wantCode: 403,
			wantError: `may not create resourcequotas.strata.io "default-resource-quota" in namespace apps`, check: notWritten},
	}
	cluster := newTestCA(t)
	pool := x509.NewCertPool()
	pool.AddCert(cluster.cert)
	verify := func() (x509.VerifyOptions, bool) {
		return x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, true
	}
	cert := cluster.client(t, bob, "strata-operators")
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := dstest.New(t, []runtime.Object{restVolume("v1", "1Gi"), restVolume("v2", "1Gi")}, nil)
			kube := newFakeKube(bob)
			kube.verbs = tc.verbs
			events := record.NewFakeRecorder(10)
			opts := Options{Log: quietLog(), REST: RESTOptions{Auth: NewKubeAuth(kube).WithClientCertificates(verify),
				Cache: env.DS, Namespace: restNS, Recorder: events, Manager: env.Strata}} // no Clients: no token path
			r := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body))
			r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}
			w := httptest.NewRecorder()
			NewHandler(&fakeImages{}, opts).ServeHTTP(w, r)

			require.Equal(t, tc.wantCode, w.Code, w.Body.String())
			if tc.wantError != "" {
				var got map[string]any
				require.NoError(t, json.Unmarshal(w.Body.Bytes(), &got))
				assert.Contains(t, got["error"], tc.wantError)
			}
			tc.check(t, env.Strata)
			close(events.Events)
			var recorded []string
			for e := range events.Events {
				recorded = append(recorded, e)
			}
			if tc.wantEvent == "" {
				assert.Empty(t, recorded)
			} else if assert.Len(t, recorded, 1) {
				assert.Contains(t, recorded[0], tc.wantEvent)
			}
		})
	}
}

// Without the manager's clientset (client certificates not taken), a
// certificate user's write is refused, never made some other way.
func TestCertificateUsersWithoutManagerWritesAreRefused(t *testing.T) {
	c := &call{opts: RESTOptions{}, user: nil}
	_, err := c.strata()
	assert.ErrorIs(t, err, ErrAuthUnavailable)
	assert.False(t, c.forCaller)
}
