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
	"k8s.io/client-go/kubernetes"

	"github.com/strata-storage/strata/types"
	"github.com/strata-storage/strata/webhook/admission"
)

// Names of the webhook's objects.
const (
	// ServiceName is the Service in front of every manager (package mode).
	ServiceName = types.WebhookServiceName
	// ServicePort is the Service's port; it targets the managers' --webhook-listen port.
	ServicePort = 443
	// LeaderLeaseName is the Lease of the manager that writes the configurations.
	LeaderLeaseName = "strata-webhook-leader"
	// MutatorConfigName and ValidatorConfigName are the webhook configurations.
	MutatorConfigName   = types.MutatorConfigName
	ValidatorConfigName = types.ValidatorConfigName
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
