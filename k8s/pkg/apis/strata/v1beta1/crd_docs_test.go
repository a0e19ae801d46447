package v1beta1_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/yaml"
)

// crdDir holds the CRDs controller-gen writes from these types.
const crdDir = "../../../../crds"

// Every bounded field says its bound in the text `kubectl explain` shows:
// the schema enforces it, and an admin should read it before being refused.
func TestCRDDescriptionsStateTheBounds(t *testing.T) {
	checked := 0
	walkCRDSchemas(t, func(path string, s map[string]any) {
		for _, want := range wantedBoundTexts(s) {
			checked++
			desc, _ := s["description"].(string)
			assert.Contains(t, desc, want, "%s: the description should state the bound", path)
		}
	})
	assert.Greater(t, checked, 20, "bounded fields found")
}

// kubectl explain backup.spec tells how to back up a whole volume: the
// label is otherwise only in the docs and make run's banner.
func TestExplainBackupSpecTellsHowToBackUpAVolume(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(crdDir, "strata.io_backups.yaml"))
	require.NoError(t, err)
	var crd map[string]any
	require.NoError(t, yaml.Unmarshal(raw, &crd))
	for _, v := range dig(crd, "spec", "versions").([]any) {
		spec := dig(v.(map[string]any), "schema", "openAPIV3Schema", "properties", "spec").(map[string]any)
		desc, _ := spec["description"].(string)
		for _, want := range []string{"whole volume", "no spec.snapshotName", "strata.io/volume=<volume>", "BackupTarget named \"default\""} {
			assert.Contains(t, desc, want)
		}
	}
}

// wantedBoundTexts is what a description must contain for the bounds of s.
func wantedBoundTexts(s map[string]any) []string {
	var out []string
	minimum, hasMin := s["minimum"]
	maximum, hasMax := s["maximum"]
	switch {
	case hasMin && hasMax:
		out = append(out, fmt.Sprintf("Between %v and %v.", minimum, maximum))
	case hasMin:
		out = append(out, fmt.Sprintf("At least %v.", minimum))
	case hasMax:
		out = append(out, fmt.Sprintf("At most %v.", maximum))
	}
	if n, ok := s["minLength"]; ok {
		if fmt.Sprint(n) == "1" {
			out = append(out, "Must not be empty.")
		} else {
			out = append(out, fmt.Sprintf("At least %v characters.", n))
		}
	}
	if n, ok := s["maxLength"]; ok {
		out = append(out, fmt.Sprintf("At most %v characters.", n))
	}
	if n, ok := s["maxProperties"]; ok {
		out = append(out, fmt.Sprintf("At most %v ", n))
	}
	if n, ok := s["maxItems"]; ok {
		out = append(out, fmt.Sprintf("At most %v ", n))
	}
	if values, ok := s["enum"].([]any); ok {
		quoted := make([]string, len(values))
		for i, v := range values {
			quoted[i] = fmt.Sprintf("%q", v)
		}
		out = append(out, "One of "+strings.Join(quoted, ", ")+".")
	}
	return out
}

// walkSchema calls fn on every schema under s: properties, map values and
// list items. metadata and conditions (metav1.Condition) are upstream's
// types, documented there.
// walkCRDSchemas calls fn for every schema node of every version of every
// CRD in crdDir, with its path from the kind.
func walkCRDSchemas(t *testing.T, fn func(path string, s map[string]any)) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(crdDir, "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		raw, err := os.ReadFile(f)
		require.NoError(t, err)
		var crd map[string]any
		require.NoError(t, yaml.Unmarshal(raw, &crd))
		kind := dig(crd, "spec", "names", "kind").(string)
		for _, v := range dig(crd, "spec", "versions").([]any) {
			walkSchema(kind, dig(v.(map[string]any), "schema", "openAPIV3Schema").(map[string]any), fn)
		}
	}
}

func walkSchema(path string, s map[string]any, fn func(string, map[string]any)) {
	fn(path, s)
	if props, ok := s["properties"].(map[string]any); ok {
		for name, p := range props {
			if name == "metadata" || name == "conditions" {
				continue
			}
			walkSchema(path+"."+name, p.(map[string]any), fn)
		}
	}
	if ap, ok := s["additionalProperties"].(map[string]any); ok {
		walkSchema(path+"[*]", ap, fn)
	}
	if items, ok := s["items"].(map[string]any); ok {
		walkSchema(path+"[]", items, fn)
	}
}

func dig(m map[string]any, keys ...string) any {
	var cur any = m
	for _, k := range keys {
		cur = cur.(map[string]any)[k]
	}
	return cur
}
