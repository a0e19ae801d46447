package datastore

import (
	"context"
	"fmt"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// Object is what every stored kind is: a runtime.Object with object metadata.
type Object interface {
	metav1.Object
	runtime.Object
}

// objectClient is the write half of a generated typed client, which every
// generated client satisfies through client-go's gentype.
type objectClient[T Object] interface {
	statuslessClient[T]
	UpdateStatus(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error)
}

// statuslessClient is the client of a kind without a status subresource.
type statuslessClient[T Object] interface {
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
	Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
}

// noStatus makes a statuslessClient an objectClient (Leases).
type noStatus[T Object] struct{ statuslessClient[T] }

func (c noStatus[T]) UpdateStatus(_ context.Context, obj T, _ metav1.UpdateOptions) (T, error) {
	var zero T
	return zero, fmt.Errorf("%T has no status subresource", obj)
}

// Store is the cached view of one kind plus its typed writes. Reads come from
// the shared informer's indexer: the *RO methods return the cached pointers
// themselves, which callers must never mutate; Get returns a deep copy to
// change and write back.
//
// Writes go straight to the API server. The cache catches up through the
// watch; a write made on a stale copy fails with a Conflict and the
// controller retries, so nobody sleeps waiting for the cache.
type Store[T Object] struct {
	resource  schema.GroupResource
	namespace string
	informer  cache.SharedIndexInformer
	client    func(namespace string) objectClient[T]
}

func newStore[T Object](resource schema.GroupResource, namespace string, informer cache.SharedIndexInformer,
	client func(namespace string) objectClient[T]) *Store[T] {
	return &Store[T]{resource: resource, namespace: namespace, informer: informer, client: client}
}

// Informer is the shared informer behind the store, for controllers to add
// event handlers to; nil for a kind the DataStore does not watch
// (NewWatching).
func (s *Store[T]) Informer() cache.SharedIndexInformer { return s.informer }

// indexer is the cache, or an error naming the kind when it is not watched.
func (s *Store[T]) indexer() (cache.Indexer, error) {
	if s.informer == nil {
		return nil, fmt.Errorf("datastore: %s are not watched by this process, so not cached", s.resource)
	}
	return s.informer.GetIndexer(), nil
}

// GetRO returns the cached object in the store's namespace. Do not mutate it.
func (s *Store[T]) GetRO(name string) (T, error) {
	return s.GetInNamespaceRO(s.namespace, name)
}

// GetInNamespaceRO returns a cached object of a kind watched in every
// namespace (ResourceQuota). Do not mutate it.
func (s *Store[T]) GetInNamespaceRO(namespace, name string) (T, error) {
	var zero T
	key := name
	if namespace != "" {
		key = namespace + "/" + name
	}
	indexer, err := s.indexer()
	if err != nil {
		return zero, err
	}
	item, exists, err := indexer.GetByKey(key)
	if err != nil {
		return zero, err
	}
	if !exists {
		return zero, apierrors.NewNotFound(s.resource, name)
	}
	obj, ok := item.(T)
	if !ok {
		return zero, fmt.Errorf("cache holds %T for %s %s", item, s.resource, key)
	}
	return obj, nil
}

// GetROOrLive returns the cached object or, when the cache has none, the
// API server's. For a caller about to refuse because an object is missing:
// the cache may be a moment behind a create the user just made.
func (s *Store[T]) GetROOrLive(ctx context.Context, name string) (T, error) {
	obj, err := s.GetRO(name)
	if !apierrors.IsNotFound(err) {
		return obj, err
	}
	return s.GetLive(ctx, name)
}

// GetLive reads the object from the API server, not the cache, for the few
// decisions that must not act on a cache a moment behind (refusing a
// request, deleting data). Do not mutate the result in place of a Get copy
// either: it is the caller's.
func (s *Store[T]) GetLive(ctx context.Context, name string) (T, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, liveReadTimeout)
		defer cancel()
	}
	return s.client(s.namespace).Get(ctx, name, metav1.GetOptions{})
}

// liveReadTimeout bounds a live read that has no deadline of its own: an
// admission webhook has a few seconds in all.
const liveReadTimeout = 3 * time.Second

// Get returns a deep copy of the cached object, safe to change and write back.
func (s *Store[T]) Get(name string) (T, error) {
	obj, err := s.GetRO(name)
	if err != nil {
		return obj, err
	}
	return obj.DeepCopyObject().(T), nil
}

// ListRO returns the cached objects matching selector (nil: all). Do not mutate them.
func (s *Store[T]) ListRO(selector labels.Selector) ([]T, error) {
	if selector == nil {
		selector = labels.Everything()
	}
	indexer, err := s.indexer()
	if err != nil {
		return nil, err
	}
	var out []T
	err = cache.ListAllByNamespace(indexer, s.namespace, selector, func(item interface{}) {
		if obj, ok := item.(T); ok {
			out = append(out, obj)
		}
	})
	return out, err
}

// ListByIndexRO returns the cached objects whose index entry equals value,
// for example every snapshot of one volume. Do not mutate them.
func (s *Store[T]) ListByIndexRO(index, value string) ([]T, error) {
	indexer, err := s.indexer()
	if err != nil {
		return nil, err
	}
	items, err := indexer.ByIndex(index, value)
	if err != nil {
		return nil, err
	}
	out := make([]T, 0, len(items))
	for _, item := range items {
		if obj, ok := item.(T); ok {
			out = append(out, obj)
		}
	}
	return out, nil
}

func (s *Store[T]) clientFor(obj T) objectClient[T] {
	ns := obj.GetNamespace()
	if ns == "" {
		ns = s.namespace
	}
	return s.client(ns)
}

// Writes return errors that name the call and the object, wrapped with %w
// so apierrors.IsConflict and friends still see the API status.
func (s *Store[T]) wrap(verb, name string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s %s %s: %w", verb, s.resource.Resource, name, err)
}

// Create writes a new object; an empty namespace means the store's namespace.
func (s *Store[T]) Create(ctx context.Context, obj T) (T, error) {
	out, err := s.clientFor(obj).Create(ctx, obj, metav1.CreateOptions{})
	return out, s.wrap("creating", obj.GetName(), err)
}

// Update writes the object's metadata and spec.
func (s *Store[T]) Update(ctx context.Context, obj T) (T, error) {
	out, err := s.clientFor(obj).Update(ctx, obj, metav1.UpdateOptions{})
	return out, s.wrap("updating", obj.GetName(), err)
}

// UpdateStatus writes the object's status subresource.
func (s *Store[T]) UpdateStatus(ctx context.Context, obj T) (T, error) {
	out, err := s.clientFor(obj).UpdateStatus(ctx, obj, metav1.UpdateOptions{})
	return out, s.wrap("updating the status of", obj.GetName(), err)
}

// Delete deletes the named object in the store's namespace. Deleting an
// object that is already gone is not an error: deletes are retried.
func (s *Store[T]) Delete(ctx context.Context, name string) error {
	err := s.client(s.namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return s.wrap("deleting", name, err)
}

// DeleteIfUID deletes the named object only while it is the one with uid,
// for a delete decided from a cached copy: an object made again under the
// same name since is left alone. deleted is false when the object was gone
// or replaced.
func (s *Store[T]) DeleteIfUID(ctx context.Context, name string, uid k8stypes.UID) (deleted bool, err error) {
	err = s.client(s.namespace).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return false, nil
	}
	return err == nil, s.wrap("deleting", name, err)
}

// AddFinalizer adds finalizer to a copy of obj and writes it if it was missing.
func (s *Store[T]) AddFinalizer(ctx context.Context, obj T, finalizer string) (T, error) {
	if slices.Contains(obj.GetFinalizers(), finalizer) {
		return obj, nil
	}
	cp := obj.DeepCopyObject().(T)
	cp.SetFinalizers(append(cp.GetFinalizers(), finalizer))
	return s.Update(ctx, cp)
}

// RemoveFinalizer removes finalizer from a copy of obj and writes it if it was there.
func (s *Store[T]) RemoveFinalizer(ctx context.Context, obj T, finalizer string) (T, error) {
	if !slices.Contains(obj.GetFinalizers(), finalizer) {
		return obj, nil
	}
	cp := obj.DeepCopyObject().(T)
	cp.SetFinalizers(slices.DeleteFunc(cp.GetFinalizers(), func(f string) bool { return f == finalizer }))
	return s.Update(ctx, cp)
}
