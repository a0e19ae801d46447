// Package deploy holds strata.yaml, the chart package/chart/strata rendered
// with its default values; its tests keep the file, the chart, the chart's
// CRD copies and package/manifests' RBAC saying the same thing.
package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/strata-storage/strata/test/need"
)

// manifestPath is the checked-in rendering; regenerate is how to renew it.
const (
	manifestPath = "strata.yaml"
	regenerate   = "make deploy-manifest"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	return root
}

// helmBinary is helm from scripts/build-tools.sh (built once, several
// minutes cold). A test that needs it skips when it cannot be built, and
// fails under CI=true: CI never passes by skipping.
func helmBinary(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	var stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(repoRoot(t), "scripts", "build-tools.sh"), "helm")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := "helm could not be built by scripts/build-tools.sh helm (" + err.Error() + "):\n" + stderr.String()
		need.Missing(t, "needs %s", msg)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "helm")
}

// renderChart is `helm template` of the chart as scripts/deploy-manifest.sh
// runs it, with more --set flags.
// renderChart renders the chart as strata.yaml is, without helm's hooks.
func renderChart(t *testing.T, helm string, sets ...string) []byte {
	t.Helper()
	return renderChartArgs(t, helm, []string{"--no-hooks"}, sets...)
}

func renderChartArgs(t *testing.T, helm string, extra []string, sets ...string) []byte {
	t.Helper()
	args := append([]string{"template", "strata", "package/chart/strata", "--namespace", "strata-system",
		"--include-crds", "--set", "createNamespace=true"}, extra...)
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	cmd := exec.Command(helm, args...)
	cmd.Dir = repoRoot(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "helm %s:\n%s", strings.Join(args, " "), stderr.String())
	return out
}

// object is one document of a manifest: its identity and its JSON.
type object struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	json              []byte
}

func (o object) key() string { return o.Kind + " " + o.Namespace + "/" + o.Name }

// decode fills v (a typed object) from o.
func (o object) decode(t *testing.T, v any) {
	t.Helper()
	require.NoError(t, yaml.Unmarshal(o.json, v), o.key())
}

// parseObjects splits a multi-document YAML stream into its objects;
// documents holding only comments are skipped.
func parseObjects(t *testing.T, data []byte) []object {
	t.Helper()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		require.NoError(t, err)
		j, err := yaml.YAMLToJSON(doc)
		require.NoError(t, err, "%s", doc)
		if string(j) == "null" {
			continue
		}
		var o object
		require.NoError(t, yaml.Unmarshal(j, &o))
		require.NotEmpty(t, o.Kind, "a document without kind:\n%s", doc)
		o.json = j
		objs = append(objs, o)
	}
}

// readObjects parses every YAML file matching glob.
func readObjects(t *testing.T, glob string) []object {
	t.Helper()
	files, err := filepath.Glob(glob)
	require.NoError(t, err)
	require.NotEmpty(t, files, glob)
	var objs []object
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		objs = append(objs, parseObjects(t, data)...)
	}
	return objs
}

// find is the object of that kind and name (any namespace), or fails.
func find(t *testing.T, objs []object, kind, name string) object {
	t.Helper()
	for _, o := range objs {
		if o.Kind == kind && o.Name == name {
			return o
		}
	}
	t.Fatalf("no %s %s", kind, name)
	return object{}
}

func rendered(t *testing.T) []object {
	t.Helper()
	data, err := os.ReadFile(manifestPath)
	require.NoError(t, err)
	return parseObjects(t, data)
}

// The checked-in strata.yaml is what the chart renders now.
func TestRenderedManifestIsCurrent(t *testing.T) {
	helm := helmBinary(t)
	cmd := exec.Command(filepath.Join(repoRoot(t), "scripts", "deploy-manifest.sh"))
	cmd.Env = append(os.Environ(), "HELM="+helm)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	got, err := cmd.Output()
	require.NoError(t, err, "scripts/deploy-manifest.sh:\n%s", stderr.String())
	want, err := os.ReadFile(manifestPath)
	require.NoError(t, err)
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		line := 0
		for line < len(gl) && line < len(wl) && gl[line] == wl[line] {
			line++
		}
		at := func(l []string) string {
			if line < len(l) {
				return l[line]
			}
			return "(end of file)"
		}
		t.Fatalf("package/deploy/strata.yaml differs from the chart's rendering at line %d:\n  file:  %s\n  chart: %s\n"+
			"regenerate it with: %s", line+1, at(wl), at(gl), regenerate)
	}
}

// The chart's CRDs are copies of k8s/crds (make generate writes those) and
// of external-snapshotter's (scripts/build-tools.sh snapshot-crds).
func TestChartCRDsAreCopies(t *testing.T) {
	root := repoRoot(t)
	var stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(root, "scripts", "build-tools.sh"), "snapshot-crds")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "scripts/build-tools.sh snapshot-crds:\n%s", stderr.String())
	snapshotCRDs := strings.TrimSpace(string(out))
	chart := filepath.Join(root, "package", "chart", "strata")
	for _, pair := range []struct{ src, dst string }{
		{filepath.Join(root, "k8s", "crds"), filepath.Join(chart, "crds")},
		{snapshotCRDs, filepath.Join(chart, "charts", "snapshot-crds", "crds")},
	} {
		srcs, _ := filepath.Glob(filepath.Join(pair.src, "*.yaml"))
		dsts, _ := filepath.Glob(filepath.Join(pair.dst, "*.yaml"))
		require.NotEmpty(t, srcs, pair.src)
		var names []string
		for _, d := range dsts {
			names = append(names, filepath.Base(d))
		}
		var want []string
		for _, s := range srcs {
			want = append(want, filepath.Base(s))
			a, err := os.ReadFile(s)
			require.NoError(t, err)
			b, err := os.ReadFile(filepath.Join(pair.dst, filepath.Base(s)))
			if err != nil || !bytes.Equal(a, b) {
				t.Errorf("%s is not a copy of %s: cp %s/*.yaml %s/ and %s", filepath.Join(pair.dst, filepath.Base(s)), s,
					pair.src, pair.dst, regenerate)
			}
		}
		require.Equal(t, want, names, "the CRD files in %s", pair.dst)
	}
	// And the rendered manifest carries every one of them.
	objs := rendered(t)
	for _, f := range append(mustGlob(t, filepath.Join(chart, "crds", "*.yaml")),
		mustGlob(t, filepath.Join(chart, "charts", "snapshot-crds", "crds", "*.yaml"))...) {
		for _, crd := range readObjects(t, f) {
			find(t, objs, "CustomResourceDefinition", crd.Name)
		}
	}
}

func mustGlob(t *testing.T, pattern string) []string {
	t.Helper()
	m, err := filepath.Glob(pattern)
	require.NoError(t, err)
	require.NotEmpty(t, m, pattern)
	return m
}
