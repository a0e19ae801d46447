package webhook

import (
	"context"
	"fmt"
	"net"
	"strconv"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	admissionac "k8s.io/client-go/applyconfigurations/admissionregistration/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/types"
	"github.com/strata-storage/strata/webhook/admission"
)

// Names of the webhook's objects.
const (
	// ServiceName is the Service in front of every manager (package mode).
	ServiceName = "strata-webhook"
	// ServicePort is the Service's port; it targets the managers' --webhook-listen port.
	ServicePort = 443
	// LeaderLeaseName is the Lease of the manager that writes the configurations.
	LeaderLeaseName = "strata-webhook-leader"
	// MutatorConfigName and ValidatorConfigName are the webhook configurations.
	MutatorConfigName   = "strata-mutator"
	ValidatorConfigName = "strata-validator"
	// ComponentWebhook labels the webhook's objects (types.LabelComponent).
	ComponentWebhook = "webhook"

	fieldManager   = "strata-manager"
	timeoutSeconds = 5
)

// target is where the API server sends admission reviews: a URL in local
// mode, where managers are processes on loopback, or the Service.
type target struct {
	baseURL   string // https://host:port, when set
	namespace string // of the Service otherwise
}

func urlTarget(host string, port int) target {
	return target{baseURL: "https://" + net.JoinHostPort(host, strconv.Itoa(port))}
}

func serviceTarget(namespace string) target { return target{namespace: namespace} }

func (t target) String() string {
	if t.baseURL != "" {
		return t.baseURL
	}
	return fmt.Sprintf("service %s/%s:%d", t.namespace, ServiceName, ServicePort)
}

func (t target) clientConfig(path string, caBundle []byte) *admissionac.WebhookClientConfigApplyConfiguration {
	cc := admissionac.WebhookClientConfig().WithCABundle(caBundle...)
	if t.baseURL != "" {
		return cc.WithURL(t.baseURL + path)
	}
	return cc.WithService(admissionac.ServiceReference().
		WithNamespace(t.namespace).WithName(ServiceName).WithPort(ServicePort).WithPath(path))
}

// rules match the handled operations of each resource (CREATE and UPDATE;
// DELETE where a validator judges it), never a subresource: the
// controllers' status writes and other kinds (Node, Setting,
// InstanceManager) are never held up by the webhook.
func rules(resources []admission.Rule) []*admissionac.RuleWithOperationsApplyConfiguration {
	var out []*admissionac.RuleWithOperationsApplyConfiguration
	for _, r := range resources {
		out = append(out, admissionac.RuleWithOperations().
			WithOperations(r.Operations...).
			WithAPIGroups(r.Group).WithAPIVersions(r.Version).WithResources(r.GroupResource.Resource).
			WithScope(admissionregistrationv1.NamespacedScope))
	}
	return out
}

func desiredMutating(t target, caBundle []byte, resources []admission.Rule) *admissionac.MutatingWebhookConfigurationApplyConfiguration {
	return admissionac.MutatingWebhookConfiguration(MutatorConfigName).
		WithLabels(map[string]string{types.LabelComponent: ComponentWebhook}).
		WithWebhooks(admissionac.MutatingWebhook().
			WithName("mutator.strata.io").
			WithClientConfig(t.clientConfig(admission.MutatePath, caBundle)).
			WithRules(rules(resources)...).
			WithFailurePolicy(admissionregistrationv1.Fail).
			WithMatchPolicy(admissionregistrationv1.Equivalent).
			WithSideEffects(admissionregistrationv1.SideEffectClassNone).
			WithTimeoutSeconds(timeoutSeconds).
			WithAdmissionReviewVersions("v1").
			WithReinvocationPolicy(admissionregistrationv1.NeverReinvocationPolicy))
}

func desiredValidating(t target, caBundle []byte, resources []admission.Rule) *admissionac.ValidatingWebhookConfigurationApplyConfiguration {
	return admissionac.ValidatingWebhookConfiguration(ValidatorConfigName).
		WithLabels(map[string]string{types.LabelComponent: ComponentWebhook}).
		WithWebhooks(admissionac.ValidatingWebhook().
			WithName("validator.strata.io").
			WithClientConfig(t.clientConfig(admission.ValidatePath, caBundle)).
			WithRules(rules(resources)...).
			WithFailurePolicy(admissionregistrationv1.Fail).
			WithMatchPolicy(admissionregistrationv1.Equivalent).
			WithSideEffects(admissionregistrationv1.SideEffectClassNone).
			WithTimeoutSeconds(timeoutSeconds).
			WithAdmissionReviewVersions("v1"))
}

// applyConfigurations writes both configurations with server-side apply: it
// updates them to exactly what is given, and writes nothing when they
// already are. Force takes over fields a previous leader or an admin's
// kubectl set. The chart (package/manifests) creates them: the managers'
// RBAC patches these two names and cannot create, so a missing one is
// refused by the API server and reported as the install's fault.
func applyConfigurations(ctx context.Context, kube kubernetes.Interface,
	mutating *admissionac.MutatingWebhookConfigurationApplyConfiguration,
	validating *admissionac.ValidatingWebhookConfigurationApplyConfiguration) error {
	opts := metav1.ApplyOptions{FieldManager: fieldManager, Force: true}
	c := kube.AdmissionregistrationV1()
	if _, err := c.MutatingWebhookConfigurations().Apply(ctx, mutating, opts); err != nil {
		return configurationError("MutatingWebhookConfiguration", MutatorConfigName, err)
	}
	if _, err := c.ValidatingWebhookConfigurations().Apply(ctx, validating, opts); err != nil {
		return configurationError("ValidatingWebhookConfiguration", ValidatorConfigName, err)
	}
	return nil
}

func configurationError(kind, name string, err error) error {
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("applying %s %s: %w (the Helm chart or package/manifests creates it; "+
			"the manager only patches it: is it missing?)", kind, name, err)
	}
	return fmt.Errorf("applying %s %s: %w", kind, name, err)
}

// applyCABundle publishes the CA bundle in a ConfigMap anyone in the
// namespace may read, so that users' tools (curl to the HTTPS API) can
// trust Strata's certificates without reading the CA Secret.
func applyCABundle(ctx context.Context, kube kubernetes.Interface, namespace string, bundle []byte) error {
	cm := corev1ac.ConfigMap(types.CABundleConfigMap, namespace).
		WithLabels(map[string]string{types.LabelComponent: pki.ComponentCA}).
		WithData(map[string]string{types.CABundleKey: string(bundle)})
	_, err := kube.CoreV1().ConfigMaps(namespace).Apply(ctx, cm, metav1.ApplyOptions{FieldManager: fieldManager, Force: true})
	if err != nil {
		return fmt.Errorf("applying ConfigMap %s: %w", types.CABundleConfigMap, err)
	}
	return nil
}
