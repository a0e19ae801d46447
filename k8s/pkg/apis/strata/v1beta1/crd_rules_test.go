package v1beta1_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/yaml"
)

// A quantity field with a CEL rule reports one error for a value that is no
// quantity (size: abc): the schema's pattern. A rule that called quantity()
// on it would fail too, with a second error about a regular expression, so
// every such rule is guarded by isQuantity.
func TestQuantityRulesSkipValuesThatAreNoQuantity(t *testing.T) {
	const guard = "!isQuantity(string(self)) || "
	files, err := filepath.Glob(filepath.Join(crdDir, "*.yaml"))
	require.NoError(t, err)
	found := 0
	for _, f := range files {
		raw, err := os.ReadFile(f)
		require.NoError(t, err)
		var crd map[string]any
		require.NoError(t, yaml.Unmarshal(raw, &crd))
		kind := dig(crd, "spec", "names", "kind").(string)
		for _, v := range dig(crd, "spec", "versions").([]any) {
			schema := dig(v.(map[string]any), "schema", "openAPIV3Schema").(map[string]any)
			walkSchema(kind, schema, func(path string, s map[string]any) {
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
		}
	}
	assert.GreaterOrEqual(t, found, 3, "the size, snapshotMaxSize and quota rules")
}
