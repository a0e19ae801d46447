package kit

import "k8s.io/client-go/tools/cache"

// Typed informer event handlers. An informer hands its handlers untyped
// objects, and a delete it only learned of from a relist comes wrapped in a
// cache.DeletedFinalStateUnknown tombstone. These adapters do the type
// assertions (and the unwrapping) once, so the handlers in the
// *_controller_base.go files are written against the informer's type and
// say only what they compare and enqueue. They go in the fields of a
// cache.ResourceEventHandlerFuncs, next to untyped funcs where a handler
// wants the raw object (c.enqueue takes a tombstone's key even when the
// tombstone carries no object).
//
// An object of another type than T is ignored: a typed informer never
// delivers one.

// OnAdd adapts fn to a ResourceEventHandlerFuncs.AddFunc.
func OnAdd[T any](fn func(T)) func(obj any) {
	return func(obj any) {
		if t, ok := obj.(T); ok {
			fn(t)
		}
	}
}

// OnUpdate adapts fn to a ResourceEventHandlerFuncs.UpdateFunc; fn is called
// only when both versions are a T.
func OnUpdate[T any](fn func(old, cur T)) func(oldObj, newObj any) {
	return func(oldObj, newObj any) {
		o, ok1 := oldObj.(T)
		n, ok2 := newObj.(T)
		if ok1 && ok2 {
			fn(o, n)
		}
	}
}

// OnDelete adapts fn to a ResourceEventHandlerFuncs.DeleteFunc. fn gets the
// last known state, from the tombstone when the informer missed the delete;
// a tombstone without an object of type T calls nothing.
func OnDelete[T any](fn func(T)) func(obj any) {
	return func(obj any) {
		if t, ok := lastState[T](obj); ok {
			fn(t)
		}
	}
}

// OnEveryChange is a handler that calls fn with the object of every add,
// update (its new version) and delete.
func OnEveryChange[T any](fn func(T)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    OnAdd(fn),
		UpdateFunc: OnUpdate(func(_, cur T) { fn(cur) }),
		DeleteFunc: OnDelete(fn),
	}
}

// FilterFor adapts keep to a FilteringResourceEventHandler.FilterFunc, which
// sees delete events' tombstones too: it judges their last known state.
func FilterFor[T any](keep func(T) bool) func(obj any) bool {
	return func(obj any) bool {
		t, ok := lastState[T](obj)
		return ok && keep(t)
	}
}

// lastState is the object of an informer event as a T: the object itself,
// or the last known state a delete's tombstone carries.
func lastState[T any](obj any) (T, bool) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	t, ok := obj.(T)
	return t, ok
}
