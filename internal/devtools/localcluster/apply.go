package localcluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

const (
	fieldManager     = "strata-localcluster"
	establishTimeout = 30 * time.Second
	// How long a kind may be missing from discovery: long for a kind whose
	// CRD this call applied, short otherwise so that a typo fails fast.
	discoveryTimeout        = 30 * time.Second
	unknownDiscoveryTimeout = 3 * time.Second
	crdKind                 = "CustomResourceDefinition"
	crdGroup                = "apiextensions.k8s.io"
	manifestsDir            = "package/manifests"
	crdsDir                 = "k8s/crds"
)

var crdResource = schema.GroupVersionResource{Group: crdGroup, Version: "v1", Resource: "customresourcedefinitions"}

// manifest is one object read from a file, with where it came from for errors.
type manifest struct {
	obj    *unstructured.Unstructured
	source string
}

// Install applies the deploy manifests and, if the directory exists yet, the
// CRDs of the repository at repoRoot.
func (c *Cluster) Install(ctx context.Context, repoRoot string) error {
	paths := []string{filepath.Join(repoRoot, manifestsDir)}
	crds := filepath.Join(repoRoot, crdsDir)
	if st, err := os.Stat(crds); err == nil && st.IsDir() {
		paths = append(paths, crds)
	} else {
		c.log.WithField("dir", crds).Warn("no CRD directory; installing without Strata's CRDs")
	}
	return c.ApplyManifests(ctx, paths...)
}

// ApplyManifests server-side applies every document in the given files and
// directories (walked in lexical order; .yaml, .yml and .json files). Namespaces
// and CRDs go first, and the CRDs must be Established before the rest is
// applied, so a file may hold objects of a kind that another file defines.
func (c *Cluster) ApplyManifests(ctx context.Context, paths ...string) error {
	docs, err := readManifests(paths)
	if err != nil {
		return err
	}
	slices.SortStableFunc(docs, func(a, b manifest) int { return applyRank(a.obj) - applyRank(b.obj) })

	dyn, err := dynamic.NewForConfig(c.AdminConfig)
	if err != nil {
		return err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(c.AdminConfig)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))

	// Namespaces and CRDs first; the rest only once the CRDs serve.
	split := slices.IndexFunc(docs, func(m manifest) bool { return applyRank(m.obj) == 2 })
	if split < 0 {
		split = len(docs)
	}
	var crds []string
	crdGroups := map[string]bool{}
	for _, m := range docs[:split] {
		if err := c.applyOne(ctx, dyn, mapper, m, unknownDiscoveryTimeout); err != nil {
			return err
		}
		if isCRD(m.obj) {
			crds = append(crds, m.obj.GetName())
			group, _, _ := unstructured.NestedString(m.obj.Object, "spec", "group")
			crdGroups[group] = true
		}
	}
	if len(crds) > 0 {
		if err := c.waitEstablished(ctx, dyn, crds); err != nil {
			return err
		}
		mapper.Reset()
	}
	for _, m := range docs[split:] {
		timeout := unknownDiscoveryTimeout
		if crdGroups[m.obj.GroupVersionKind().Group] {
			timeout = discoveryTimeout
		}
		if err := c.applyOne(ctx, dyn, mapper, m, timeout); err != nil {
			return err
		}
	}
	c.log.WithFields(logrus.Fields{"objects": len(docs), "paths": paths}).Info("applied manifests")
	return nil
}

func (c *Cluster) applyOne(ctx context.Context, dyn dynamic.Interface, mapper *restmapper.DeferredDiscoveryRESTMapper,
	m manifest, mappingTimeout time.Duration) error {
	gvk := m.obj.GroupVersionKind()
	var mapping *meta.RESTMapping
	var mapErr error
	// A kind served by a CRD applied moments ago may not be in discovery yet.
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, mappingTimeout, true, func(context.Context) (bool, error) {
		mapping, mapErr = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if meta.IsNoMatchError(mapErr) {
			mapper.Reset()
			return false, nil
		}
		return mapErr == nil, mapErr
	})
	if err != nil {
		return fmt.Errorf("%s: no API serves %s: %w", m.source, gvk, cmp.Or(mapErr, err))
	}
	var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := m.obj.GetNamespace()
		if ns == "" {
			ns = metav1.NamespaceDefault
		}
		ri = dyn.Resource(mapping.Resource).Namespace(ns)
	}
	// Force: this tool owns the local cluster, so it wins any field conflict.
	if _, err := ri.Apply(ctx, m.obj.GetName(), m.obj, metav1.ApplyOptions{FieldManager: fieldManager, Force: true}); err != nil {
		return fmt.Errorf("%s: apply %s %q: %w", m.source, gvk.Kind, m.obj.GetName(), err)
	}
	c.log.WithFields(logrus.Fields{"kind": gvk.Kind, "name": m.obj.GetName(), "namespace": m.obj.GetNamespace(),
		"source": m.source}).Debug("applied")
	return nil
}

// waitEstablished waits until every named CRD has condition Established=True.
func (c *Cluster) waitEstablished(ctx context.Context, dyn dynamic.Interface, names []string) error {
	for _, name := range names {
		var last string
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, establishTimeout, true, func(ctx context.Context) (bool, error) {
			crd, err := dyn.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			last = fmt.Sprint(conds)
			for _, cond := range conds {
				cm, _ := cond.(map[string]any)
				if cm["type"] == "Established" && cm["status"] == "True" {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w (conditions: %s)", name, err, last)
		}
	}
	c.log.WithField("crds", len(names)).Info("CRDs established")
	return nil
}

// applyRank orders documents: namespaces, then CRDs, then everything else.
func applyRank(u *unstructured.Unstructured) int {
	switch {
	case u.GetKind() == "Namespace" && u.GroupVersionKind().Group == "":
		return 0
	case isCRD(u):
		return 1
	default:
		return 2
	}
}

func isCRD(u *unstructured.Unstructured) bool {
	return u.GetKind() == crdKind && u.GroupVersionKind().Group == crdGroup
}

// readManifests reads every document of every manifest file under paths.
// A path that does not exist is an error: a typo must not install nothing.
func readManifests(paths []string) ([]manifest, error) {
	var files []string
	for _, p := range paths {
		err := filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			// A file named explicitly is read whatever its extension.
			if !d.IsDir() && (path == p || isManifestFile(path)) {
				files = append(files, path)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("manifests: %w", err)
		}
	}
	var docs []manifest
	for _, f := range files {
		fileDocs, err := readManifestFile(f)
		if err != nil {
			return nil, err
		}
		docs = append(docs, fileDocs...)
	}
	return docs, nil
}

func isManifestFile(path string) bool {
	switch filepath.Ext(path) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

func readManifestFile(path string) ([]manifest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var docs []manifest
	dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
	for i := 1; ; i++ {
		var raw map[string]any
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			return docs, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s document %d: %w", path, i, err)
		}
		if len(raw) == 0 { // an empty or comment-only document
			continue
		}
		source := fmt.Sprintf("%s#%d", path, i)
		obj := &unstructured.Unstructured{Object: raw}
		var objs []*unstructured.Unstructured
		if obj.IsList() {
			err = obj.EachListItem(func(o runtime.Object) error {
				objs = append(objs, o.(*unstructured.Unstructured))
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", source, err)
			}
		} else {
			objs = append(objs, obj)
		}
		for _, o := range objs {
			if o.GetKind() == "" || o.GetAPIVersion() == "" || o.GetName() == "" {
				return nil, fmt.Errorf("%s: a document needs apiVersion, kind and metadata.name", source)
			}
			docs = append(docs, manifest{obj: o, source: source})
		}
	}
}
