package pki

import (
	"context"

	"github.com/sirupsen/logrus"
	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Run settles the requests of SignerName until ctx ends, as a controller:
// an informer on this signer's CertificateSigningRequests alone (a field
// selector; resync 0), a rate-limited queue of their names, one worker
// calling Handle on the cached request. A request Handle could not settle
// (the signer's own trouble) is retried with backoff.
func (s *Signer) Run(ctx context.Context, log logrus.FieldLogger) {
	factory := informers.NewSharedInformerFactoryWithOptions(s.Kube, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.signerName", SignerName).String()
		}))
	informer := factory.Certificates().V1().CertificateSigningRequests()
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "strata-signer"})
	defer queue.ShutDown()
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			queue.Add(key)
		}
	}
	if _, err := informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, n any) { enqueue(n) }}); err != nil {
		log.WithError(err).Error("Cannot watch CertificateSigningRequests")
		return
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), informer.Informer().HasSynced) {
		return
	}
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	for s.next(ctx, queue, informer.Lister().Get, log) {
	}
}

// next handles one queued request; false once the queue is shut down.
func (s *Signer) next(ctx context.Context, queue workqueue.TypedRateLimitingInterface[string],
	get func(string) (*certificatesv1.CertificateSigningRequest, error), log logrus.FieldLogger) bool {
	name, quit := queue.Get()
	if quit {
		return false
	}
	defer queue.Done(name)
	req, err := get(name)
	switch {
	case apierrors.IsNotFound(err):
		err = nil // gone: nothing to settle
	case err == nil:
		err = s.Handle(ctx, req)
	}
	if err != nil && ctx.Err() == nil {
		log.WithError(err).WithField("request", name).Warn("Cannot settle a certificate request; retrying")
		queue.AddRateLimited(name)
		return true
	}
	queue.Forget(name)
	return true
}
