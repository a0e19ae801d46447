package api

import (
	"context"
	"fmt"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned"
)

// kind is what list, get and delete of one Strata kind need: reads from
// the cache, the delete made as the caller.
type kind[T datastore.Object] struct {
	resource string // as RBAC names it: volumes
	noun     string // in errors: volume
	store    func(*datastore.DataStore) *datastore.Store[T]
	deleter  func(strata versioned.Interface, namespace string) func(context.Context, string, metav1.DeleteOptions) error
	creator  func(strata versioned.Interface, namespace string) func(context.Context, T, metav1.CreateOptions) (T, error)
}

var (
	volumes = kind[*v1beta1.Volume]{resource: "volumes", noun: "volume",
		store: func(ds *datastore.DataStore) *datastore.Store[*v1beta1.Volume] { return ds.Volumes },
		deleter: func(s versioned.Interface, ns string) func(context.Context, string, metav1.DeleteOptions) error {
			return s.StrataV1beta1().Volumes(ns).Delete
		},
		creator: func(s versioned.Interface, ns string) func(context.Context, *v1beta1.Volume, metav1.CreateOptions) (*v1beta1.Volume, error) {
			return s.StrataV1beta1().Volumes(ns).Create
		}}
	backups = kind[*v1beta1.Backup]{resource: "backups", noun: "backup",
		store: func(ds *datastore.DataStore) *datastore.Store[*v1beta1.Backup] { return ds.Backups },
		deleter: func(s versioned.Interface, ns string) func(context.Context, string, metav1.DeleteOptions) error {
			return s.StrataV1beta1().Backups(ns).Delete
		},
		creator: func(s versioned.Interface, ns string) func(context.Context, *v1beta1.Backup, metav1.CreateOptions) (*v1beta1.Backup, error) {
			return s.StrataV1beta1().Backups(ns).Create
		}}
	backingImages = kind[*v1beta1.BackingImage]{resource: "backingimages", noun: "backing image",
		store: func(ds *datastore.DataStore) *datastore.Store[*v1beta1.BackingImage] { return ds.BackingImages },
		deleter: func(s versioned.Interface, ns string) func(context.Context, string, metav1.DeleteOptions) error {
			return s.StrataV1beta1().BackingImages(ns).Delete
		},
		creator: func(s versioned.Interface, ns string) func(context.Context, *v1beta1.BackingImage, metav1.CreateOptions) (*v1beta1.BackingImage, error) {
			return s.StrataV1beta1().BackingImages(ns).Create
		}}
)

func (k kind[T]) list(c *call) error {
	if err := c.authorize("list", k.resource, c.opts.Namespace, ""); err != nil {
		return err
	}
	objs, err := k.store(c.opts.Cache).ListRO(nil)
	if err != nil {
		return err
	}
	return c.reply(http.StatusOK, list[T]{Items: sortedByName(objs)})
}

func (k kind[T]) get(c *call) error {
	name := c.r.PathValue("name")
	if err := c.authorize("get", k.resource, c.opts.Namespace, name); err != nil {
		return err
	}
	obj, err := k.cached(c, name)
	if err != nil {
		return err
	}
	return c.reply(http.StatusOK, obj)
}

// cached is the named object from the cache or, when the cache has none,
// from the API server (a client that just created it must not get a 404
// from a cache a moment behind); a 404 when neither has it.
func (k kind[T]) cached(c *call, name string) (T, error) {
	obj, err := k.store(c.opts.Cache).GetROOrLive(c.r.Context(), name)
	var zero T
	switch {
	case apierrors.IsNotFound(err):
		return zero, fmt.Errorf("%s %q: %w", k.noun, name, errNotFound)
	case err != nil:
		return zero, fmt.Errorf("reading %s %q: %w", k.noun, name, err)
	}
	return obj, nil
}

func (k kind[T]) delete(c *call) error {
	name := c.r.PathValue("name")
	if err := c.authorize("delete", k.resource, c.opts.Namespace, name); err != nil {
		return err
	}
	strata, err := c.strata()
	if err != nil {
		return err
	}
	// The event's object: read before it is gone (the cache only).
	obj, inCache := k.store(c.opts.Cache).GetRO(name)
	if err := k.deleter(strata, c.opts.Namespace)(c.ctx(), name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	if inCache == nil {
		c.wrote(obj, name, "deleted")
	} else {
		c.wrote(nil, name, "deleted")
	}
	return c.reply(http.StatusNoContent, nil)
}

// create makes obj as the caller, after the access review of create on
// its name (empty for a generated one), and answers 201 with it.
func (k kind[T]) create(c *call, obj T) error {
	if err := c.authorize("create", k.resource, c.opts.Namespace, obj.GetName()); err != nil {
		return err
	}
	strata, err := c.strata()
	if err != nil {
		return err
	}
	c.stamp(obj)
	created, err := k.creator(strata, c.opts.Namespace)(c.ctx(), obj, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	c.wrote(created, created.GetName(), "created")
	return c.reply(http.StatusCreated, created)
}
