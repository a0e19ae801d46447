package app

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned/fake"
)

func TestUninstallCheck(t *testing.T) {
	volume := func(ns, name string) runtime.Object {
		return &v1beta1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	}
	many := []runtime.Object{}
	for i := range 25 {
		many = append(many, volume("strata-system", fmt.Sprintf("v%02d", i)))
	}
	tests := []struct {
		name    string
		objects []runtime.Object
		wantErr []string // substrings of the refusal; none: allowed
	}{
		{name: "no volume: allowed"},
		{name: "volumes of another namespace only: allowed", objects: []runtime.Object{volume("other", "x")}},
		{name: "volumes: refused, named in order", objects: []runtime.Object{volume("strata-system", "b"), volume("strata-system", "a")},
			wantErr: []string{"refusing to uninstall Strata: 2 volume(s) exist in namespace strata-system: a, b."}},
		{name: "many volumes: the first 20 named", objects: many,
			wantErr: []string{"25 volume(s)", "v00, v01", "v19, and 5 more"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := uninstallCheck(context.Background(), fake.NewSimpleClientset(tc.objects...), "strata-system", &out)
			if len(tc.wantErr) == 0 {
				require.NoError(t, err)
				assert.Contains(t, out.String(), "uninstalling may go on")
				return
			}
			require.Error(t, err)
			var exit cli.ExitCoder
			require.ErrorAs(t, err, &exit)
			assert.Equal(t, 1, exit.ExitCode())
			for _, want := range tc.wantErr {
				assert.Contains(t, err.Error(), want)
			}
			assert.NotContains(t, err.Error(), "v20", "at most 20 names")
		})
	}
}
