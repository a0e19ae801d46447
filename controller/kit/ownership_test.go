package kit

import (
	"fmt"
	"testing"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestResponsibleNode(t *testing.T) {
	alive := []string{"node-1", "node-2", "node-3"}
	tests := []struct {
		name               string
		ownerID, preferred string
		alive              []string
		want               string
	}{
		{"alive preferred node wins over owner", "node-1", "node-2", alive, "node-2"},
		{"alive owner keeps its object", "node-3", "", alive, "node-3"},
		{"dead preferred falls back to alive owner", "node-1", "node-9", alive, "node-1"},
		{"nobody alive means nobody", "node-1", "", nil, ""},
		{"only survivor takes over", "node-1", "", []string{"node-2"}, "node-2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, ResponsibleNode("strata-system/obj", tc.ownerID, tc.preferred, tc.alive))
		})
	}
}

func TestOrphansSpreadAndStayPut(t *testing.T) {
	alive := []string{"node-1", "node-2", "node-3"}
	counts := map[string]int{}
	for i := 0; i < 300; i++ {
		key := fmt.Sprintf("strata-system/vol-%d", i)
		winner := ResponsibleNode(key, "node-dead", "", alive)
		counts[winner]++
		// Order of the alive list must not matter: every manager agrees.
		assert.Equal(t, winner, ResponsibleNode(key, "node-dead", "", []string{"node-3", "node-1", "node-2"}))
		// Losing a node that did not win moves nothing.
		for _, gone := range alive {
			if gone == winner {
				continue
			}
			var rest []string
			for _, n := range alive {
				if n != gone {
					rest = append(rest, n)
				}
			}
			assert.Equal(t, winner, ResponsibleNode(key, "node-dead", "", rest))
		}
	}
	for _, n := range alive {
		assert.Greater(t, counts[n], 60, "orphans spread over every survivor: %v", counts)
	}
}

func TestReadyFlipped(t *testing.T) {
	node := func(conds ...metav1.Condition) *v1beta1.Node {
		n := fixture.Node("node-2", nil, conds...)
		return n
	}
	renewed := node(fixture.ReadyTrue())
	renewed.Status.DiskPaths = "/x"
	tests := []struct {
		name     string
		old, cur *v1beta1.Node
		want     bool
	}{
		{"a status change that keeps Ready", node(fixture.ReadyTrue()), renewed, false},
		{"Ready True -> False", node(fixture.ReadyTrue()), node(fixture.ReadyDown("gone")), true},
		{"Ready False -> True", node(fixture.ReadyDown("gone")), node(fixture.ReadyTrue()), true},
		{"no condition -> True", node(), node(fixture.ReadyTrue()), true},
		{"False with another message", node(fixture.ReadyDown("gone")), node(fixture.ReadyDown("still gone")), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, readyFlipped(tc.old, tc.cur))
		})
	}
}
