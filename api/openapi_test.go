package api

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// The OpenAPI document lists every route the handler serves, each action
// of every POST with actions, and nothing else.
func TestOpenAPIListsEveryRoute(t *testing.T) {
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	require.NoError(t, yaml.Unmarshal(openAPI, &doc))
	documented := map[string][]string{} // "METHOD path" -> actions
	for path, ops := range doc.Paths {
		for method, raw := range ops {
			if method == "parameters" { // the path's, not an operation
				continue
			}
			var op struct {
				Parameters []struct {
					Name   string `json:"name"`
					Schema struct {
						Enum []string `json:"enum"`
					} `json:"schema"`
				} `json:"parameters"`
			}
			require.NoError(t, json.Unmarshal(raw, &op), "%s %s", method, path)
			key := strings.ToUpper(method) + " " + path
			documented[key] = nil
			for _, p := range op.Parameters {
				if p.Name == "action" {
					documented[key] = slices.Sorted(slices.Values(p.Schema.Enum))
				}
			}
		}
	}

	served := map[string][]string{uploadRoute: nil, peerCopyRoute: nil}
	for _, rt := range restRoutes() {
		key := rt.method + " " + rt.path
		require.NotContains(t, served, key, "a route given twice")
		served[key] = nil
		if rt.actions != nil {
			served[key] = slices.Sorted(maps.Keys(rt.actions))
		}
	}
	assert.Equal(t, served, documented, "api/openapi.yaml against the routes")
}
