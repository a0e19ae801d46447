package crdquantity

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// crd is a CRD as controller-gen writes it, with the schema of spec given.
func crd(spec string) string {
	return `---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: things.strata.io
spec:
  group: strata.io
  versions:
  - name: v1beta1
    schema:
      openAPIV3Schema:
        properties:
          spec:
` + spec + `          status:
            properties:
              used:
                anyOf:
                - type: integer
                - type: string
                pattern: ` + Pattern + `
                x-kubernetes-int-or-string: true
            type: object
        type: object
    served: true
    storage: true
`
}

func TestRewrite(t *testing.T) {
	cases := []struct {
		name, spec, want string
		n                int
	}{
		{name: "no quantity: the bytes come back as they were", n: 0, spec: `            properties:
              name:
                type: string
            type: object
`},
		{name: "a quantity: its pattern becomes the rule, first, with the bound", n: 1, spec: `            properties:
              size:
                anyOf:
                - type: integer
                - type: string
                description: Size is the capacity.
                pattern: ` + Pattern + `
                x-kubernetes-int-or-string: true
                x-kubernetes-validations:
                - message: must be greater than 0
                  rule: quantity(string(self)).isGreaterThan(quantity('0'))
            type: object
`, want: `            properties:
              size:
                anyOf:
                - type: integer
                - type: string
                description: |-
                  Size is the capacity.
                  At most 64 characters.
                maxLength: 64
                x-kubernetes-int-or-string: true
                x-kubernetes-validations:
                - message: not a quantity such as 10Gi
                  rule: isQuantity(string(self))
                - message: must be greater than 0
                  rule: quantity(string(self)).isGreaterThan(quantity('0'))
            type: object
`},
		{name: "a map of quantities: each value", n: 1, spec: `            properties:
              quota:
                additionalProperties:
                  anyOf:
                  - type: integer
                  - type: string
                  pattern: ` + Pattern + `
                  x-kubernetes-int-or-string: true
                type: object
            type: object
`, want: `            properties:
              quota:
                additionalProperties:
                  anyOf:
                  - type: integer
                  - type: string
                  description: A quantity such as 10Gi. At most 64 characters.
                  maxLength: 64
                  x-kubernetes-int-or-string: true
                  x-kubernetes-validations:
                  - message: not a quantity such as 10Gi
                    rule: isQuantity(string(self))
                type: object
            type: object
`},
		{name: "another pattern is left alone", n: 0, spec: `            properties:
              path:
                pattern: ^/
                type: string
            type: object
`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, n, err := Rewrite([]byte(crd(tc.spec)))
			require.NoError(t, err)
			assert.Equal(t, tc.n, n)
			want := tc.want
			if want == "" {
				want = tc.spec
			}
			assert.Equal(t, crd(want), string(out))
			assert.Equal(t, 1, strings.Count(string(out), "pattern: "+Pattern), "the status keeps its pattern")
		})
	}
}
