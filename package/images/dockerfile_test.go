package images

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/package/hostpackages"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	line int    // where it starts, for messages
	op   string // upper case: FROM, RUN, COPY, …
	args string
}

// stage is one FROM and the instructions under it.
type stage struct {
	image, name string
	body        []instruction
}

// parseDockerfile reads the instructions this test checks; it knows
// comments, line continuations and `FROM image [AS name]`, nothing more.
func parseDockerfile(t *testing.T, text string) []stage {
	t.Helper()
	var stages []stage
	var cur *instruction
	lines := strings.Split(text, "\n")
	for i, raw := range lines {
		line := strings.TrimSpace(raw)
		if cur == nil && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if cur == nil {
			op, args, _ := strings.Cut(line, " ")
			cur = &instruction{line: i + 1, op: strings.ToUpper(op)}
			line = args
		}
		if strings.HasPrefix(line, "#") { // a comment inside a continued RUN
			continue
		}
		more := strings.HasSuffix(line, "\\")
		cur.args = strings.TrimSpace(cur.args + " " + strings.TrimSuffix(line, "\\"))
		if more && i < len(lines)-1 {
			continue
		}
		if cur.op == "FROM" {
			f := strings.Fields(cur.args)
			s := stage{image: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				s.name = f[2]
			}
			stages = append(stages, s)
		} else if len(stages) == 0 {
			require.Equal(t, "ARG", cur.op, "line %d: only ARG may come before the first FROM", cur.line)
		} else {
			stages[len(stages)-1].body = append(stages[len(stages)-1].body, *cur)
		}
		cur = nil
	}
	return stages
}

// aptPackages are the package arguments of every `apt-get install` in a RUN.
func aptPackages(run string) []string {
	var pkgs []string
	for _, cmd := range strings.FieldsFunc(run, func(r rune) bool { return r == ';' || r == '&' || r == '|' }) {
		f := strings.Fields(cmd)
		i := slices.Index(f, "install")
		if i < 0 || !slices.Contains(f[:i], "apt-get") {
			continue
		}
		for _, arg := range f[i+1:] {
			if !strings.HasPrefix(arg, "-") {
				pkgs = append(pkgs, arg)
			}
		}
	}
	return pkgs
}

// package/Dockerfile must build what the recipe builds: a Go builder stage,
// a Debian bookworm runtime with exactly the packages of role image, and
// the binary at the path (and as the command) the recipe gives it. The
// recipe copies host programs of Debian 12; the Dockerfile installs them
// from the same release.
func TestDockerfileMatchesTheRecipe(t *testing.T) {
	text, err := os.ReadFile(filepath.Join("..", "Dockerfile"))
	require.NoError(t, err)
	stages := parseDockerfile(t, string(text))
	require.GreaterOrEqual(t, len(stages), 2, "a multi-stage build: a Go builder and the runtime")
	builder, runtime := stages[0], stages[len(stages)-1]
	assert.True(t, strings.HasPrefix(builder.image, "golang:"), "the first stage builds with golang, not %s", builder.image)
	require.NotEmpty(t, builder.name, "the builder stage needs a name (FROM … AS build) for COPY --from")
	assert.Equal(t, "debian:bookworm-slim", runtime.image, "the runtime stage")

	want := map[string]bool{}
	for _, e := range hostpackages.ForRole(hostpackages.RoleImage) {
		want[e.Package] = true
	}
	got := map[string]bool{}
	var copied, cmd []string
	for _, in := range runtime.body {
		switch in.op {
		case "RUN":
			for _, p := range aptPackages(in.args) {
				got[p] = true
			}
		case "COPY":
			f := strings.Fields(in.args)
			if slices.Contains(f, "--from="+builder.name) {
				copied = append(copied, f[len(f)-1])
			}
		case "CMD", "ENTRYPOINT":
			require.NoError(t, json.Unmarshal([]byte(in.args), &cmd), "line %d: %s in exec form", in.line, in.op)
		}
	}
	assert.Equal(t, sortedKeys(want), sortedKeys(got),
		"package/Dockerfile's apt-get install must name exactly the packages of role image in package/hostpackages/packages.txt")
	assert.Equal(t, []string{managerPath}, copied, "the binary copied from the builder")
	assert.Equal(t, []string{managerPath}, cmd, "the image's command, as the recipe's")
}

func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// The parser itself: continuations, comments inside a RUN, two installs.
func TestParseDockerfile(t *testing.T) {
	stages := parseDockerfile(t, "# c\nFROM golang:1 AS b\nRUN x \\\n  # note\n  y\nFROM debian\n"+
		"RUN apt-get update && apt-get install -y --no-install-recommends \\\n  a \\\n  b && rm -rf z; apt-get install c\n")
	require.Len(t, stages, 2)
	assert.Equal(t, "b", stages[0].name)
	assert.Equal(t, "x y", stages[0].body[0].args)
	assert.Equal(t, []string{"a", "b", "c"}, aptPackages(stages[1].body[0].args))
}
