// Package crdquantity makes the CRDs refuse a size that is no quantity with
// a sentence instead of a regular expression (issue 23).
//
// controller-gen gives every resource.Quantity field the same schema, a
// `pattern` among them, and no marker can take the pattern away: a field's
// own markers are merged with it, never replace it. So `spec.size: abc` was
// refused with "should match '^(\+|-)?(([0-9]+(\.[0-9]*)?)|…'". Rewrite runs
// on controller-gen's output (k8s/codegen.sh) and, under every version's
// spec, replaces that pattern with a CEL rule, isQuantity, whose message
// says what is expected (and a length bound the rule's cost needs). Status fields keep the pattern: only the managers
// write them, and a rule there would cost validation budget for nothing.
package crdquantity

import (
	"bytes"

	yaml "go.yaml.in/yaml/v2"
)

const (
	// Pattern is the one controller-gen writes for resource.Quantity.
	Pattern = `^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$`
	// Rule and Message replace it. The API server adds the field and the
	// value: `spec.size: Invalid value: "abc": not a quantity such as 10Gi`.
	Rule    = "isQuantity(string(self))"
	Message = "not a quantity such as 10Gi"
	// MaxLength bounds a quantity's text, and Bound says so in the field's
	// description (kubectl explain). The API server estimates a rule's cost
	// from the longest string it may see, and refuses a CRD whose rule on a
	// map's values (vmTotalSnapshotSizeQuota) or on a field inside a map
	// (disks.*.storageReserved) has no bound. No quantity needs more.
	MaxLength = 64
	Bound     = "At most 64 characters."
)

// header is what controller-gen writes before each CRD.
var header = []byte("---\n")

// Rewrite returns the CRD YAML crd with the quantity fields under each
// version's spec checked by Rule and MaxLength instead of Pattern, and how
// many fields it rewrote. The YAML is written back as controller-gen
// writes it (yaml.v2, sorted keys): only the rewritten fields differ, and
// a CRD with no quantity comes back byte for byte.
func Rewrite(crd []byte) ([]byte, int, error) {
	var doc map[any]any
	if err := yaml.Unmarshal(crd, &doc); err != nil {
		return nil, 0, err
	}
	spec, _ := doc["spec"].(map[any]any)
	versions, _ := spec["versions"].([]any)
	n := 0
	for _, v := range versions {
		schema := dig(v, "schema", "openAPIV3Schema", "properties", "spec")
		if schema == nil {
			continue
		}
		n += rewriteQuantities(schema)
	}
	if n == 0 {
		return crd, 0, nil
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		return nil, 0, err
	}
	if bytes.HasPrefix(crd, header) {
		out = append(append([]byte{}, header...), out...)
	}
	return out, n, nil
}

// rewriteQuantities rewrites s and every schema under it (properties, map
// values, list items) that is a quantity.
func rewriteQuantities(s map[any]any) int {
	n := 0
	if s["pattern"] == Pattern && s["x-kubernetes-int-or-string"] == true {
		delete(s, "pattern")
		s["maxLength"] = MaxLength
		s["description"] = describe(s["description"])
		rules, _ := s["x-kubernetes-validations"].([]any)
		// First, so it is the first error an admin reads.
		s["x-kubernetes-validations"] = append([]any{map[any]any{"rule": Rule, "message": Message}}, rules...)
		n++
	}
	if props, ok := s["properties"].(map[any]any); ok {
		for _, p := range props {
			if ps, ok := p.(map[any]any); ok {
				n += rewriteQuantities(ps)
			}
		}
	}
	for _, key := range []string{"additionalProperties", "items"} {
		if sub, ok := s[key].(map[any]any); ok {
			n += rewriteQuantities(sub)
		}
	}
	return n
}

// describe is a quantity's description with its bound; a map's values
// have none of their own.
func describe(d any) string {
	if text, _ := d.(string); text != "" {
		return text + "\n" + Bound
	}
	return "A quantity such as 10Gi. " + Bound
}

// dig follows keys through nested maps; nil when one is missing.
func dig(v any, keys ...string) map[any]any {
	for _, k := range keys {
		m, ok := v.(map[any]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	m, _ := v.(map[any]any)
	return m
}
