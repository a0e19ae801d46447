package v1beta1_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/strata-storage/strata/internal/devtools/crdquantity"
)

// A quantity field with a CEL rule reports one error for a value that is no
// quantity (size: abc): the isQuantity rule every quantity gets
// (internal/devtools/crdquantity). A rule that called quantity() on it would fail
// too, with a second error about a regular expression, so every such rule
// is guarded by isQuantity.
func TestQuantityRulesSkipValuesThatAreNoQuantity(t *testing.T) {
	const guard = "!isQuantity(string(self)) || "
	found := 0
	walkCRDSchemas(t, func(path string, s map[string]any) {
		rules, _ := s["x-kubernetes-validations"].([]any)
		for _, r := range rules {
			rule := r.(map[string]any)["rule"].(string)
			if !strings.Contains(rule, "quantity(string(self))") {
				continue
			}
			found++
			assert.True(t, strings.HasPrefix(rule, guard), "%s: rule %q should start with %q", path, rule, guard)
		}
	})
	assert.GreaterOrEqual(t, found, 3, "the size, snapshotMaxSize and quota rules")
}

// Every quantity a user writes is checked by the isQuantity rule, not by
// controller-gen's pattern, whose refusal prints a regular expression.
func TestUserQuantitiesHaveNoPattern(t *testing.T) {
	rewritten := 0
	walkCRDSchemas(t, func(path string, s map[string]any) {
		if s["x-kubernetes-int-or-string"] != true || !strings.Contains(path, ".spec.") {
			return
		}
		assert.NotContains(t, s, "pattern", path)
		rules, _ := s["x-kubernetes-validations"].([]any)
		if assert.NotEmpty(t, rules, path) {
			assert.Equal(t, crdquantity.Rule, rules[0].(map[string]any)["rule"], path)
			rewritten++
		}
	})
	assert.GreaterOrEqual(t, rewritten, 5, "size, snapshotMaxSize, storageReserved and both snapshot quotas")
}

// What the API server answers for a quantity: the field's path and a
// sentence, one error per bad value, never the pattern.
func TestQuantityRefusals(t *testing.T) {
	volume := func(spec map[string]any) map[string]any {
		return map[string]any{"apiVersion": "strata.io/v1beta1", "kind": "Volume",
			"metadata": map[string]any{"name": "v1", "namespace": "strata-system"}, "spec": spec}
	}
	node := func(reserved any) map[string]any {
		return map[string]any{"apiVersion": "strata.io/v1beta1", "kind": "Node",
			"metadata": map[string]any{"name": "n1", "namespace": "strata-system"},
			"spec": map[string]any{"disks": map[string]any{"d1": map[string]any{"path": "/data", "allowScheduling": true,
				"storageReserved": reserved}}}}
	}
	quota := func(limit map[string]any) map[string]any {
		return map[string]any{"apiVersion": "strata.io/v1beta1", "kind": "ResourceQuota",
			"metadata": map[string]any{"name": "default-resource-quota", "namespace": "apps"},
			"spec":     map[string]any{"snapshotLimit": limit}}
	}
	cases := []struct {
		name string
		crd  string
		obj  map[string]any
		want []string // every error, as the API server words it after "Volume.strata.io "v1" is invalid: "
	}{
		{"a size with a unit", "strata.io_volumes.yaml", volume(map[string]any{"size": "10Gi"}), nil},
		{"a size in bytes, as a number", "strata.io_volumes.yaml", volume(map[string]any{"size": 1 << 30}), nil},
		{"a size that is no quantity", "strata.io_volumes.yaml", volume(map[string]any{"size": "ten gigs"}),
			[]string{"spec.size: Invalid value: \"ten gigs\": not a quantity such as 10Gi"}},
		{"a size with a unit of another kind", "strata.io_volumes.yaml", volume(map[string]any{"size": "10GB"}),
			[]string{"spec.size: Invalid value: \"10GB\": not a quantity such as 10Gi"}},
		{"a size too long to be one", "strata.io_volumes.yaml", volume(map[string]any{"size": strings.Repeat("9", 65)}),
			[]string{"spec.size: Too long: may not be more than 64 bytes"}},
		{"a negative size: the rule of the field says it", "strata.io_volumes.yaml", volume(map[string]any{"size": "-1Gi"}),
			[]string{"spec.size: Invalid value: \"-1Gi\": must be greater than 0"}},
		{"a snapshot cap that is no quantity", "strata.io_volumes.yaml",
			volume(map[string]any{"size": "1Gi", "snapshotMaxSize": "lots"}),
			[]string{"spec.snapshotMaxSize: Invalid value: \"lots\": not a quantity such as 10Gi"}},
		{"a disk's reserve that is no quantity", "strata.io_nodes.yaml", node("10 Gi"),
			[]string{"spec.disks[d1].storageReserved: Invalid value: \"10 Gi\": not a quantity such as 10Gi"}},
		{"a disk's reserve", "strata.io_nodes.yaml", node("10Gi"), nil},
		{"a namespace quota that is no quantity", "strata.io_resourcequotas.yaml",
			quota(map[string]any{"namespaceTotalSnapshotSizeQuota": "100 G"}),
			[]string{"spec.snapshotLimit.namespaceTotalSnapshotSizeQuota: Invalid value: \"100 G\": not a quantity such as 10Gi"}},
		{"a VM's quota that is no quantity", "strata.io_resourcequotas.yaml",
			quota(map[string]any{"vmTotalSnapshotSizeQuota": map[string]any{"vm1": "20Gi", "vm2": "twenty"}}),
			[]string{"spec.snapshotLimit.vmTotalSnapshotSizeQuota[vm2]: Invalid value: \"twenty\": not a quantity such as 10Gi"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, e := range validateCR(t, tc.crd, tc.obj) {
				got = append(got, e.Error())
			}
			assert.Equal(t, tc.want, got)
		})
	}
}
