package importcheck

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestCheck(t *testing.T) {
	tests := []struct {
		name       string
		from, to   string
		testTo     string
		production []string
		want       []string
	}{
		{name: "down the layers", from: "controller", to: "datastore"},
		{name: "the data plane's own packages", from: "engine/imserver", to: "engineapi"},
		{name: "libraries build on each other", from: "internal/backupstore", to: "internal/atomicfile"},
		{name: "a webhook's own packages", from: "webhook/resources/volume", to: "webhook/admission"},
		{name: "a family's kit", from: "controller/volume", to: "controller/kit"},
		{name: "the controllers' root wires the families", from: "controller", to: "controller/volume"},
		{name: "tools import anything", from: "internal/devtools/localcluster", to: "webhook"},
		{name: "up", from: "internal/pki", to: "controller",
			want: []string{"internal/pki -> controller: points up the layers (0 -> 3)"}},
		{name: "the data plane up to the control plane", from: "engine/imserver", to: "datastore",
			want: []string{"engine/imserver -> datastore: points up the layers (1 -> 2)"}},
		{name: "across: a family into another", from: "controller/volume", to: "controller/backup",
			want: []string{"controller/volume -> controller/backup: across families (controller/volume -> controller/backup)"}},
		{name: "across: a family into the root", from: "controller/volume", to: "controller",
			want: []string{"controller/volume -> controller: across families (controller/volume -> controller)"}},
		{name: "across: webhook into controller", from: "webhook", to: "controller",
			want: []string{"webhook -> controller: across families (webhook -> controller)"}},
		{name: "the REST API into a controller", from: "api", to: "controller",
			want: []string{"api -> controller: api talks to Strata through types and clients only"}},
		{name: "the plugin into the webhook", from: "app/kubectlstrata", to: "webhook",
			want: []string{"app/kubectlstrata -> webhook: app/kubectlstrata talks to Strata through types and clients only"}},
		{name: "production into a tool", from: "controller", to: "internal/devtools/localcluster",
			want: []string{"controller -> internal/devtools/localcluster: a production package imports a development tool"}},
		{name: "a family's tests use the test support", from: "controller/volume", testTo: "controller/fixture"},
		{name: "a family's tests use the real instance manager rig", from: "controller/node", testTo: "controller/kit/kittest"},
		{name: "production into the test support", from: "controller/volume", to: "controller/fixture",
			want: []string{"controller/volume -> controller/fixture: a production package imports a development tool"}},
		{name: "across: a family's tests into another family", from: "controller/snapshot", testTo: "controller/instance",
			want: []string{"controller/snapshot -> controller/instance: across families (controller/snapshot -> controller/instance)"}},
		{name: "a tool linked into the binary", production: []string{"app", "test/need"},
			want: []string{"test/need: a development tool linked into the strata binary"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var pkgs []Package
			if tc.from != "" {
				pkgs = []Package{{Path: tc.from}}
				if tc.to != "" {
					pkgs[0].Imports = []string{tc.to}
				}
				if tc.testTo != "" {
					pkgs[0].TestImports = []string{tc.testTo}
				}
			}
			assert.Equal(t, tc.want, Check(pkgs, tc.production))
		})
	}
}
