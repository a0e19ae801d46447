package pki

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/strata-storage/strata/types"
)

// CASecretName is the Secret holding Strata's CA (its name is from when
// only the admission webhook used it).
const CASecretName = "strata-webhook-ca"

// ComponentCA labels the CA Secret.
const ComponentCA = "ca"

// LoadOrCreateCASecret reads the CA Secret from the API server and creates it
// with a new CA when it is absent. Should two signers ever create it at once
// (a leader change in the middle), the one whose create loses reads the
// winner's Secret, so there is one CA.
func LoadOrCreateCASecret(ctx context.Context, secrets corev1client.SecretInterface, now time.Time) (*corev1.Secret, error) {
	secret, err := secrets.Get(ctx, CASecretName, metav1.GetOptions{})
	if err == nil {
		return secret, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("reading Secret %s: %w", CASecretName, err)
	}
	state, err := NewCAState(now)
	if err != nil {
		return nil, err
	}
	data, err := state.SecretData()
	if err != nil {
		return nil, err
	}
	secret = &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: CASecretName,
			Labels: map[string]string{types.LabelComponent: ComponentCA}},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
	created, err := secrets.Create(ctx, secret, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		if created, err = secrets.Get(ctx, CASecretName, metav1.GetOptions{}); err != nil {
			return nil, fmt.Errorf("reading Secret %s another signer created: %w", CASecretName, err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("creating Secret %s: %w", CASecretName, err)
	}
	return created, nil
}

// WriteCAState stores state into the Secret it was read from. A Conflict
// means another writer was first; the caller tries again from the new Secret.
func WriteCAState(ctx context.Context, secrets corev1client.SecretInterface, from *corev1.Secret, state *CAState) error {
	data, err := state.SecretData()
	if err != nil {
		return err
	}
	secret := from.DeepCopy()
	secret.Data = data
	if _, err := secrets.Update(ctx, secret, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating Secret %s: %w", CASecretName, err)
	}
	return nil
}
