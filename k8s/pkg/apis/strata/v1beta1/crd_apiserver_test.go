package v1beta1_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdvalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/yaml"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
)

// The API server's own checks, run here on the CRDs in crdDir so a unit test
// finds what only installing them would: a schema that is not structural, a
// CEL rule that does not compile or costs more than the server allows, and
// the exact errors an object is refused with.

// loadCRD reads a CRD of crdDir as the API server holds it.
func loadCRD(t *testing.T, file string) *apiextensions.CustomResourceDefinition {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(crdDir, file))
	require.NoError(t, err)
	var v1 apiextensionsv1.CustomResourceDefinition
	require.NoError(t, yaml.Unmarshal(raw, &v1))
	var crd apiextensions.CustomResourceDefinition
	require.NoError(t, apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(&v1, &crd, nil))
	for _, v := range crd.Spec.Versions {
		if v.Storage { // the server records it on create
			crd.Status.StoredVersions = append(crd.Status.StoredVersions, v.Name)
		}
	}
	return &crd
}

// validateCR validates obj against the first version of the CRD in file as
// the API server does on create: the OpenAPI schema, then (when that found
// nothing that blocks it) the CEL rules.
func validateCR(t *testing.T, file string, obj map[string]any) field.ErrorList {
	t.Helper()
	crd := loadCRD(t, file)
	props := crd.Spec.Validation
	if props == nil {
		props = crd.Spec.Versions[0].Schema
	}
	require.NotNil(t, props)
	validator, _, err := apiservervalidation.NewSchemaValidator(props.OpenAPIV3Schema)
	require.NoError(t, err)
	errs := apiservervalidation.ValidateCustomResource(nil, obj, validator)
	for _, e := range errs {
		switch e.Type {
		case field.ErrorTypeNotSupported, field.ErrorTypeRequired, field.ErrorTypeTooLong, field.ErrorTypeTooMany,
			field.ErrorTypeTypeInvalid:
			return errs
		}
	}
	structural, err := structuralschema.NewStructural(props.OpenAPIV3Schema)
	require.NoError(t, err)
	celErrs, _ := cel.NewValidator(structural, true, celconfig.PerCallLimit).
		Validate(context.Background(), nil, structural, obj, nil, celconfig.RuntimeCELCostBudget)
	return append(errs, celErrs...)
}

// Every CRD is one the API server accepts: structural, its rules compiled
// and within the cost budgets (a quantity rule inside a map is the kind of
// rule that is not).
func TestCRDsAreAcceptedByTheAPIServer(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(crdDir, "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			errs := crdvalidation.ValidateCustomResourceDefinition(context.Background(), loadCRD(t, filepath.Base(f)))
			require.Empty(t, errs.ToAggregate(), "the API server refuses the CRD")
		})
	}
}
