package hostpackages

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEmbeddedListParses(t *testing.T) {
	entries, err := parse(list)
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, e := range entries {
		assert.False(t, seen[e.File], "%s listed twice", e.File)
		seen[e.File] = true
	}
	for _, role := range []string{RoleBuild, RoleNode, RoleImage} {
		assert.NotEmpty(t, ForRole(role), role)
	}
}

func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct{ name, text, want string }{
		{"two columns", "image qemu-utils\n", "line 1: want role, package and file"},
		{"unknown role", "# c\nbuld make make\n", `line 2: unknown role "buld"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(tc.text)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}
