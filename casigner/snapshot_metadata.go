package casigner

// Changed-block tracking's front door (CSI SnapshotMetadata, KEP-3314):
// backup tools find the upstream external-snapshot-metadata sidecar, which
// runs in the CSI controller Pod, through a cluster-scoped
// SnapshotMetadataService named after the CSI driver. It carries the
// sidecar's address, the token audience the sidecar expects and the CA its
// serving certificate chains to. The CA signer holds Strata's CA and
// publishes its bundle, so it keeps these too: the
// sidecar's certificate in a Secret the CSI controller Pod mounts (the
// sidecar reloads the files when the kubelet updates them) and the CR.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	smsv1beta1 "github.com/kubernetes-csi/external-snapshot-metadata/client/apis/snapshotmetadataservice/v1beta1"
	smsclient "github.com/kubernetes-csi/external-snapshot-metadata/client/clientset/versioned"
	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/utils/ptr"

	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/types"
)

const (
	// SnapshotMetadataSecretName holds the sidecar's serving certificate
	// (tls.crt, tls.key).
	SnapshotMetadataSecretName = "strata-snapshot-metadata-tls"
	// SnapshotMetadataServiceName is the chart's Service in front of the
	// sidecar; its certificate names it.
	SnapshotMetadataServiceName = "strata-snapshot-metadata"
	// DefaultSnapshotMetadataAudience is the audience backup tools' tokens
	// are asked for by default.
	DefaultSnapshotMetadataAudience = "strata-snapshot-metadata"
	// ComponentSnapshotMetadata labels the Secret and the CR.
	ComponentSnapshotMetadata = "snapshot-metadata"
)

// SnapshotMetadataOptions say where backup tools reach the sidecar.
type SnapshotMetadataOptions struct {
	// Address is host:port, written into the CR; the certificate names its host.
	Address string
	// Audience is the one the sidecar's --audience names.
	Audience string
	// Client writes the CR; nil: made from the manager's configuration.
	Client smsclient.Interface
}

func (o *SnapshotMetadataOptions) validate() error {
	host, port, err := net.SplitHostPort(o.Address)
	if err != nil || host == "" {
		return fmt.Errorf("--snapshot-metadata-address %q: want host:port, the address backup tools dial", o.Address)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("--snapshot-metadata-address %q: port %q is not between 1 and 65535", o.Address, port)
	}
	if o.Audience == "" {
		return errors.New("--snapshot-metadata-audience: empty; the sidecar needs an audience to check tokens against")
	}
	if o.Client == nil {
		return errors.New("snapshot metadata: no client for SnapshotMetadataServices")
	}
	return nil
}

// snapshotMetadataHosts are the names in the sidecar's certificate: the
// Service's and the advertised address's host.
func snapshotMetadataHosts(namespace, address string) []string {
	svc := SnapshotMetadataServiceName
	hosts := []string{svc, svc + "." + namespace, svc + "." + namespace + ".svc", svc + "." + namespace + ".svc.cluster.local"}
	if host, _, err := net.SplitHostPort(address); err == nil && host != "" && !slices.Contains(hosts, host) {
		hosts = append(hosts, host)
	}
	return hosts
}

// metadataState is what the leader remembers of the publication.
type metadataState struct {
	cert      *servingCert // in the Secret
	applied   []byte       // the CR last applied
	appliedAt time.Time
	missing   bool // the CRD is not installed (logged once)
}

// publishSnapshotMetadata keeps the sidecar's certificate and the CR
// current; it returns when the certificate is next due. Off without
// options.
func (s *Server) publishSnapshotMetadata(ctx context.Context, st *metadataState, state *pki.CAState,
	now time.Time) (time.Duration, error) {
	o := s.opts.SnapshotMetadata
	if o == nil {
		return resync, nil
	}
	hosts := snapshotMetadataHosts(s.opts.Namespace, o.Address)
	if st.cert == nil || st.cert.due(state, hosts, now) {
		cert, err := s.metadataCertInSecret(ctx, state, hosts, now)
		if err != nil {
			return 0, err
		}
		if cert == nil {
			if cert, err = issueServing(state.Current, SnapshotMetadataServiceName, hosts, now); err != nil {
				return 0, fmt.Errorf("issuing the snapshot metadata sidecar's certificate: %w", err)
			}
			if err := s.applyMetadataSecret(ctx, cert); err != nil {
				return 0, err
			}
			s.log.WithFields(logrus.Fields{"secret": SnapshotMetadataSecretName, "hosts": hosts,
				"renewAt": cert.renewAt.Format(time.RFC3339)}).Info("Issued the snapshot metadata sidecar's certificate")
		}
		st.cert = cert
	}
	next := min(max(st.cert.renewAt.Sub(now), time.Second), resync)
	desired := desiredMetadataService(o, state.BundlePEM())
	data, err := json.Marshal(desired)
	if err != nil {
		return 0, err
	}
	if bytes.Equal(data, st.applied) && now.Sub(st.appliedAt) < reapplyEvery {
		return next, nil
	}
	_, err = o.Client.CbtV1beta1().SnapshotMetadataServices().Patch(ctx, desired.Name, k8stypes.ApplyPatchType, data,
		metav1.PatchOptions{FieldManager: fieldManager, Force: ptr.To(true)})
	if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
		if !st.missing {
			s.log.Warn("The SnapshotMetadataService CRD (cbt.storage.k8s.io) is not installed: backup tools cannot find " +
				"the snapshot metadata sidecar; install it (the chart's snapshot-crds) and the CA signer publishes the CR")
		}
		st.missing = true
		return resync, nil
	}
	if err != nil {
		return 0, fmt.Errorf("applying SnapshotMetadataService %s: %w", desired.Name, err)
	}
	if !bytes.Equal(data, st.applied) {
		s.log.WithFields(logrus.Fields{"address": o.Address, "audience": o.Audience}).
			Info("Published the SnapshotMetadataService for backup tools")
	}
	st.applied, st.appliedAt, st.missing = data, now, false
	return next, nil
}

// desiredMetadataService is the CR, named after the CSI driver as backup
// tools look it up.
func desiredMetadataService(o *SnapshotMetadataOptions, bundle []byte) *smsv1beta1.SnapshotMetadataService {
	return &smsv1beta1.SnapshotMetadataService{
		TypeMeta: metav1.TypeMeta{APIVersion: smsv1beta1.SchemeGroupVersion.String(), Kind: "SnapshotMetadataService"},
		ObjectMeta: metav1.ObjectMeta{Name: types.CSIDriverName,
			Labels: map[string]string{types.LabelComponent: ComponentSnapshotMetadata}},
		Spec: smsv1beta1.SnapshotMetadataServiceSpec{Address: o.Address, Audience: o.Audience, CACert: bundle},
	}
}

// metadataCertInSecret is the certificate the Secret holds, or nil when
// there is none, it does not parse, or it is due.
func (s *Server) metadataCertInSecret(ctx context.Context, state *pki.CAState, hosts []string,
	now time.Time) (*servingCert, error) {
	secret, err := s.secretsClient.Get(ctx, SnapshotMetadataSecretName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading Secret %s: %w", SnapshotMetadataSecretName, err)
	}
	pair, err := tls.X509KeyPair(secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		s.log.WithError(err).WithField("secret", SnapshotMetadataSecretName).Warn("Replacing an unusable certificate")
		return nil, nil
	}
	if pair.Leaf.CheckSignatureFrom(state.Current.Cert) != nil {
		return nil, nil // another CA's: replaced
	}
	if cert := newServingCert(&pair, state.Current.Cert); !cert.due(state, hosts, now) {
		return cert, nil
	}
	return nil, nil
}

// applyMetadataSecret writes the certificate and its key. The CA bundle is
// the CR's: clients read it there.
func (s *Server) applyMetadataSecret(ctx context.Context, cert *servingCert) error {
	key, err := x509.MarshalPKCS8PrivateKey(cert.cert.PrivateKey)
	if err != nil {
		return err
	}
	secret := corev1ac.Secret(SnapshotMetadataSecretName, s.opts.Namespace).
		WithLabels(map[string]string{types.LabelComponent: ComponentSnapshotMetadata}).
		WithType(corev1.SecretTypeTLS).
		WithData(map[string][]byte{
			corev1.TLSCertKey:       pki.CertPEM(cert.cert.Leaf),
			corev1.TLSPrivateKeyKey: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}),
		})
	if _, err := s.secretsClient.Apply(ctx, secret, metav1.ApplyOptions{FieldManager: fieldManager, Force: true}); err != nil {
		return fmt.Errorf("applying Secret %s: %w", SnapshotMetadataSecretName, err)
	}
	return nil
}
