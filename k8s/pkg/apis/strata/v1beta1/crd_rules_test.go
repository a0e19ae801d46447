package v1beta1_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A quantity field with a CEL rule reports one error for a value that is no
// quantity (size: abc): the schema's pattern. A rule that called quantity()
// on it would fail too, with a second error about a regular expression, so
// every such rule is guarded by isQuantity.
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
