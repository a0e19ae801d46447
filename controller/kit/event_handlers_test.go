package kit

import (
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// TestTypedEventHandlers drives the adapters through a
// cache.ResourceEventHandlerFuncs, as an informer does, and records which
// typed calls it makes.
func TestTypedEventHandlers(t *testing.T) {
	e1 := &v1beta1.Engine{ObjectMeta: metav1.ObjectMeta{Name: "e1"}}
	e2 := &v1beta1.Engine{ObjectMeta: metav1.ObjectMeta{Name: "e2"}}
	r := &v1beta1.Replica{ObjectMeta: metav1.ObjectMeta{Name: "r"}}
	tomb := func(obj any) cache.DeletedFinalStateUnknown {
		return cache.DeletedFinalStateUnknown{Key: "ns/x", Obj: obj}
	}

	tests := []struct {
		name string
		fire func(h cache.ResourceEventHandler)
		want []string
	}{
		{"add", func(h cache.ResourceEventHandler) { h.OnAdd(e1, false) }, []string{"add e1"}},
		{"add of another type", func(h cache.ResourceEventHandler) { h.OnAdd(r, false) }, nil},
		{"update", func(h cache.ResourceEventHandler) { h.OnUpdate(e1, e2) }, []string{"update e1 e2"}},
		{"update, old of another type", func(h cache.ResourceEventHandler) { h.OnUpdate(r, e2) }, nil},
		{"update, new of another type", func(h cache.ResourceEventHandler) { h.OnUpdate(e1, "x") }, nil},
		{"delete", func(h cache.ResourceEventHandler) { h.OnDelete(e1) }, []string{"delete e1"}},
		{"delete seen by a relist", func(h cache.ResourceEventHandler) { h.OnDelete(tomb(e2)) }, []string{"delete e2"}},
		{"tombstone without an object", func(h cache.ResourceEventHandler) { h.OnDelete(tomb(nil)) }, nil},
		{"tombstone of another type", func(h cache.ResourceEventHandler) { h.OnDelete(tomb(r)) }, nil},
		{"delete of another type", func(h cache.ResourceEventHandler) { h.OnDelete(r) }, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			h := cache.ResourceEventHandlerFuncs{
				AddFunc: OnAdd(func(e *v1beta1.Engine) { got = append(got, "add "+e.Name) }),
				UpdateFunc: OnUpdate(func(o, n *v1beta1.Engine) {
					got = append(got, "update "+o.Name+" "+n.Name)
				}),
				DeleteFunc: OnDelete(func(e *v1beta1.Engine) { got = append(got, "delete "+e.Name) }),
			}
			tc.fire(h)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestTypedEventHandlersInterface: T may be an interface every kind of an
// informer implements (the AD controller's ticket owners).
func TestTypedEventHandlersInterface(t *testing.T) {
	var got []string
	h := cache.ResourceEventHandlerFuncs{
		UpdateFunc: OnUpdate(func(o, n metav1.Object) { got = append(got, o.GetName()+">"+n.GetName()) }),
		DeleteFunc: OnDelete(func(m metav1.Object) { got = append(got, "-"+m.GetName()) }),
	}
	s := &v1beta1.Snapshot{ObjectMeta: metav1.ObjectMeta{Name: "s"}}
	b := &v1beta1.Backup{ObjectMeta: metav1.ObjectMeta{Name: "b"}}
	h.OnUpdate(s, b)
	h.OnDelete(cache.DeletedFinalStateUnknown{Key: "ns/b", Obj: b})
	h.OnDelete("not an object")
	assert.Equal(t, []string{"s>b", "-b"}, got)
}

func TestFilterFor(t *testing.T) {
	keep := FilterFor(func(im *v1beta1.InstanceManager) bool { return im.Name == "mine" })
	mine := &v1beta1.InstanceManager{ObjectMeta: metav1.ObjectMeta{Name: "mine"}}
	other := &v1beta1.InstanceManager{ObjectMeta: metav1.ObjectMeta{Name: "other"}}
	tests := []struct {
		name string
		obj  any
		want bool
	}{
		{"kept", mine, true},
		{"refused", other, false},
		{"tombstone of a kept object", cache.DeletedFinalStateUnknown{Key: "ns/mine", Obj: mine}, true},
		{"tombstone of a refused object", cache.DeletedFinalStateUnknown{Key: "ns/other", Obj: other}, false},
		{"tombstone without an object", cache.DeletedFinalStateUnknown{Key: "ns/mine"}, false},
		{"another type", &v1beta1.Engine{ObjectMeta: metav1.ObjectMeta{Name: "mine"}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, keep(tc.obj))
		})
	}
}
