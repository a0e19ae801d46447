package casigner

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/types"
)

// leaderState is what the leader remembers between passes.
type leaderState struct {
	published   []byte    // the trust ConfigMap's data last applied
	publishedAt time.Time // when it was last applied
	// nextTrustedAt is when the webhook configurations were first seen
	// trusting the next CA of a rotation under way.
	nextTrustedAt time.Time
	metadata      metadataState
}

// reconcile is one pass of the leader: rotate the CA when due (the
// Secret's update brings the next pass), publish the trust, keep the
// snapshot metadata sidecar's certificate and CR, promote a next CA once
// the webhook configurations trust it, retire a replaced one. It returns
// when to look again.
func (s *Server) reconcile(ctx context.Context, st *leaderState) (time.Duration, error) {
	now := s.opts.Clock.Now()
	secret, err := s.caSecret(ctx)
	if err != nil {
		return 0, err
	}
	state, err := pki.ParseCAState(secret.Data)
	if err != nil {
		// Nothing can be signed from a Secret that does not parse.
		s.log.WithError(err).Error("The CA Secret is unusable; replacing it with a new CA")
		if state, err = pki.NewCAState(now); err != nil {
			return 0, err
		}
		return retryWait, pki.WriteCAState(ctx, s.secretsClient, secret, state)
	}
	if _, asked := secret.Annotations[pki.AnnotationRotateCA]; asked {
		started, err := state.StartRotation(now)
		if err != nil {
			return 0, err
		}
		s.log.WithField("started", started).Info("Rotating the CA as the Secret's annotation asks")
		secret = secret.DeepCopy()
		delete(secret.Annotations, pki.AnnotationRotateCA)
		return retryWait, pki.WriteCAState(ctx, s.secretsClient, secret, state)
	}
	if changed, err := state.Rotate(now, s.opts.CARotateBefore); err != nil {
		return 0, err
	} else if changed {
		s.log.WithFields(logrus.Fields{"current": state.Current.Cert.Subject.CommonName,
			"expires": state.Current.Cert.NotAfter.Format(time.RFC3339), "bundle": len(state.Bundle),
			"rotating": state.Next != nil}).Info("Rotating the CA")
		return retryWait, pki.WriteCAState(ctx, s.secretsClient, secret, state)
	}
	if err := s.publishTrust(ctx, st, state.Trust(), now); err != nil {
		return 0, err
	}
	next, err := s.publishSnapshotMetadata(ctx, &st.metadata, state, now)
	if err != nil {
		return 0, err
	}

	// Phase 2 of a rotation: the next CA signs once the API server has
	// had it in the webhook configurations' bundle for promoteAfter.
	if state.Next != nil {
		trusted, err := s.configurationsTrust(ctx, state.Next.Cert)
		if err != nil {
			return 0, err
		}
		if !trusted {
			st.nextTrustedAt = time.Time{}
			return min(retryWait, next), nil // the webhook leader applies it within seconds
		}
		if st.nextTrustedAt.IsZero() {
			st.nextTrustedAt = now
		}
		if wait := st.nextTrustedAt.Add(promoteAfter).Sub(now); wait > 0 {
			return min(wait, next), nil
		}
		state.Promote(now)
		st.nextTrustedAt = time.Time{}
		s.log.WithField("ca", state.Current.Cert.Subject.CommonName).Info("The new CA now signs certificates")
		return retryWait, pki.WriteCAState(ctx, s.secretsClient, secret, state)
	}
	// Phase 3: the replaced CA leaves every trust bundle once everyone has
	// been signed a certificate by the new one.
	if due := state.RetireDue(retireAfter); !due.IsZero() {
		if wait := due.Sub(now); wait > 0 {
			return min(wait, next), nil
		}
		if state.Retire() {
			s.log.WithFields(logrus.Fields{"ca": state.Current.Cert.Subject.CommonName, "cas": len(state.Bundle)}).
				Info("Retired the replaced CA: certificates it signed are refused from now on")
		}
		return retryWait, pki.WriteCAState(ctx, s.secretsClient, secret, state)
	}
	return min(resync, next), nil
}

// publishTrust applies the trust ConfigMap when it changed, and every
// reapplyEvery to undo an edit; anyone in the cluster may read it.
func (s *Server) publishTrust(ctx context.Context, st *leaderState, trust *pki.Trust, now time.Time) error {
	data := trust.ConfigMapData()
	encoded, err := json.Marshal(data)
	if err != nil {
		return err
	}
	if bytes.Equal(encoded, st.published) && now.Sub(st.publishedAt) < reapplyEvery {
		return nil
	}
	cm := corev1ac.ConfigMap(types.CABundleConfigMap, s.opts.Namespace).
		WithLabels(map[string]string{types.LabelComponent: pki.ComponentCA}).WithData(data)
	if _, err := s.kube.CoreV1().ConfigMaps(s.opts.Namespace).Apply(ctx, cm,
		metav1.ApplyOptions{FieldManager: fieldManager, Force: true}); err != nil {
		return fmt.Errorf("applying ConfigMap %s: %w", types.CABundleConfigMap, err)
	}
	if !bytes.Equal(encoded, st.published) {
		s.log.WithFields(logrus.Fields{"configMap": types.CABundleConfigMap, "cas": len(trust.Bundle),
			"signing": trust.Signing.Subject.CommonName}).Info("Published the CA bundle")
	}
	st.published, st.publishedAt = encoded, now
	return nil
}

// configurationsTrust reports whether every webhook of the admission
// configurations carries ca in its caBundle, so that the API server keeps
// calling the webhooks once serving certificates come from it. A
// configuration that is absent or has no webhooks yet calls nothing.
func (s *Server) configurationsTrust(ctx context.Context, ca *x509.Certificate) (bool, error) {
	var configs []admissionregistrationv1.WebhookClientConfig
	admission := s.kube.AdmissionregistrationV1()
	mc, err := admission.MutatingWebhookConfigurations().Get(ctx, types.MutatorConfigName, metav1.GetOptions{})
	switch {
	case err == nil:
		for _, w := range mc.Webhooks {
			configs = append(configs, w.ClientConfig)
		}
	case !apierrors.IsNotFound(err):
		return false, fmt.Errorf("reading MutatingWebhookConfiguration %s: %w", types.MutatorConfigName, err)
	}
	vc, err := admission.ValidatingWebhookConfigurations().Get(ctx, types.ValidatorConfigName, metav1.GetOptions{})
	switch {
	case err == nil:
		for _, w := range vc.Webhooks {
			configs = append(configs, w.ClientConfig)
		}
	case !apierrors.IsNotFound(err):
		return false, fmt.Errorf("reading ValidatingWebhookConfiguration %s: %w", types.ValidatorConfigName, err)
	}
	for _, cc := range configs {
		bundle, err := pki.ParseCerts(cc.CABundle)
		if err != nil || !(&pki.Trust{Bundle: bundle}).Trusts(ca) {
			return false, nil
		}
	}
	return true, nil
}
