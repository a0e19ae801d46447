package need

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// recorder is a TB that notes how the test would have ended.
type recorder struct{ fatal, skip string }

func (r *recorder) Helper()           {}
func (r *recorder) Fatal(args ...any) { r.fatal = args[0].(string) }
func (r *recorder) Skip(args ...any)  { r.skip = args[0].(string) }

func TestMissingSkipsOrFailsUnderCI(t *testing.T) {
	for _, tc := range []struct {
		ci, ok      string
		fatal, skip string
	}{
		{ci: "", fatal: "", skip: "needs x (y)"},
		{ci: "false", fatal: "", skip: "needs x (y)"},
		{ci: "true", fatal: "CI=true, and the test needs x (y)", skip: ""},
		{ci: "true", ok: "yes"},
	} {
		t.Run("CI="+tc.ci+",ok="+tc.ok, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			r := &recorder{}
			That(r, tc.ok != "", "needs %s (%s)", "x", "y")
			assert.Equal(t, tc.fatal, r.fatal)
			assert.Equal(t, tc.skip, r.skip)
		})
	}
}

func TestToolNamesItsPackage(t *testing.T) {
	t.Setenv("CI", "")
	r := &recorder{}
	Tool(r, "strata-no-such-command", "strata-pkg")
	assert.Equal(t, "needs strata-no-such-command (Debian package strata-pkg)", r.skip)
	r = &recorder{}
	Tool(r, "sh", "dash")
	assert.Empty(t, r.skip)
}
