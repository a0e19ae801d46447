package testtimes

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const stream = `{"Action":"start","Package":"m/a"}
{"Action":"run","Package":"m/a","Test":"TestOK"}
{"Action":"output","Package":"m/a","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"output","Package":"m/a","Test":"TestOK","Output":"quiet line\n"}
{"Action":"pass","Package":"m/a","Test":"TestOK","Elapsed":1.5}
{"Action":"run","Package":"m/a","Test":"TestBad"}
{"Action":"run","Package":"m/a","Test":"TestBad/sub"}
{"Action":"output","Package":"m/a","Test":"TestBad/sub","Output":"    bad_test.go:9: boom\n"}
{"Action":"fail","Package":"m/a","Test":"TestBad/sub","Elapsed":2}
{"Action":"output","Package":"m/a","Test":"TestBad","Output":"--- FAIL: TestBad (2.00s)\n"}
{"Action":"fail","Package":"m/a","Test":"TestBad","Elapsed":2.1}
{"Action":"output","Package":"m/a","Output":"FAIL\tm/a\t3.700s\n"}
{"Action":"fail","Package":"m/a","Elapsed":3.7}
# m/b [build failed]
{"ImportPath":"m/e","Action":"build-output","Output":"e.go:1: syntax error\n"}
{"ImportPath":"m/e","Action":"build-fail"}
{"Action":"output","Package":"m/c","Output":"PASS\n"}
{"Action":"output","Package":"m/c","Output":"ok  \tm/c\t9.000s\n"}
{"Action":"pass","Package":"m/c","Elapsed":9}
{"Action":"skip","Package":"m/d","Elapsed":0}
{"Time":"2026-01-01T00:00:00Z","Action":"run","Package":"m/f","Test":"TestParallelKids"}
{"Time":"2026-01-01T00:00:01Z","Action":"run","Package":"m/f","Test":"TestParallelKids/1"}
{"Time":"2026-01-01T00:00:01Z","Action":"pause","Package":"m/f","Test":"TestParallelKids/1"}
{"Time":"2026-01-01T00:00:01Z","Action":"cont","Package":"m/f","Test":"TestParallelKids/1"}
{"Time":"2026-01-01T00:00:09Z","Action":"pass","Package":"m/f","Test":"TestParallelKids/1","Elapsed":8}
{"Time":"2026-01-01T00:00:09Z","Action":"pass","Package":"m/f","Test":"TestParallelKids","Elapsed":0.01}
{"Time":"2026-01-01T00:00:00Z","Action":"run","Package":"m/f","Test":"TestPaused"}
{"Time":"2026-01-01T00:00:00Z","Action":"pause","Package":"m/f","Test":"TestPaused"}
{"Time":"2026-01-01T00:00:20Z","Action":"cont","Package":"m/f","Test":"TestPaused"}
{"Time":"2026-01-01T00:00:22Z","Action":"pass","Package":"m/f","Test":"TestPaused","Elapsed":2}
`

func TestRead(t *testing.T) {
	var out bytes.Buffer
	run, err := Read(strings.NewReader(stream), &out)
	require.NoError(t, err)
	assert.True(t, run.Failed)
	assert.Equal(t, []Result{
		{Package: "m/a", Test: "TestOK", Action: "pass", Elapsed: 1500 * time.Millisecond},
		{Package: "m/a", Test: "TestBad", Action: "fail", Elapsed: 2100 * time.Millisecond},
		{Package: "m/f", Test: "TestParallelKids", Action: "pass", Elapsed: 9 * time.Second},
		{Package: "m/f", Test: "TestPaused", Action: "pass", Elapsed: 2 * time.Second},
	}, run.Tests, "top-level tests only, with their parallel subtests' time and without a pause's")
	assert.Len(t, run.Packages, 3)
	assert.Equal(t, "    bad_test.go:9: boom\n--- FAIL: TestBad (2.00s)\nFAIL\tm/a\t3.700s\n"+
		"# m/b [build failed]\ne.go:1: syntax error\nok  \tm/c\t9.000s\n", out.String(),
		"a failed test's lines with its subtests', package summaries, and non-JSON lines; nothing of a passing test")
}

func TestMarkdown(t *testing.T) {
	run, err := Read(strings.NewReader(stream), nil)
	require.NoError(t, err)
	var md bytes.Buffer
	run.Markdown(&md, 1, "m/")
	assert.Equal(t, `| package | result | wall time |
|---|---|---:|
| c | pass | 9.0 s |
| a | fail | 3.7 s |
| (sum over packages; go test runs as many at once as there are cores) | | 12.7 s |

| test | result | wall time |
|---|---|---:|
| f.TestParallelKids | pass | 9.0 s |
`, md.String())
}

func TestFailures(t *testing.T) {
	const mainFailed = `{"Action":"run","Package":"m/g","Test":"TestFine"}
{"Action":"pass","Package":"m/g","Test":"TestFine","Elapsed":1}
{"Action":"output","Package":"m/g","Output":"manager log line\n"}
{"Action":"output","Package":"m/g","Output":"audit check failed: unused grant\n"}
{"Action":"output","Package":"m/g","Output":"FAIL\tm/g\t5.000s\n"}
{"Action":"fail","Package":"m/g","Elapsed":5}
`
	tests := []struct {
		name, stream, want string
	}{
		{"a failed test, a build failure, a TestMain failure", stream + mainFailed, `What failed:
- e: did not build (its compiler output is above)
- a.TestBad (its output is above)
- g: failed outside its tests (TestMain, a panic or a timeout); its last lines:
    manager log line
    audit check failed: unused grant
    FAIL	m/g	5.000s
`},
		{"nothing failed", `{"Action":"pass","Package":"m/c","Elapsed":9}
`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run, err := Read(strings.NewReader(tt.stream), nil)
			require.NoError(t, err)
			var out bytes.Buffer
			run.Failures(&out, "m/")
			assert.Equal(t, tt.want, out.String())
		})
	}
}

func TestSkipLine(t *testing.T) {
	const skips = `{"Action":"run","Package":"m/h","Test":"TestNeedsRoot"}
{"Action":"output","Package":"m/h","Test":"TestNeedsRoot","Output":"=== RUN   TestNeedsRoot\n"}
{"Action":"output","Package":"m/h","Test":"TestNeedsRoot","Output":"    root_test.go:12: needs root (mounts)\n"}
{"Action":"output","Package":"m/h","Test":"TestNeedsRoot","Output":"--- SKIP: TestNeedsRoot (0.00s)\n"}
{"Action":"skip","Package":"m/h","Test":"TestNeedsRoot","Elapsed":0}
{"Action":"run","Package":"m/h","Test":"TestTable/one"}
{"Action":"output","Package":"m/h","Test":"TestTable/one","Output":"    table_test.go:40: needs qemu-img (Debian package qemu-utils)\n"}
{"Action":"output","Package":"m/h","Test":"TestTable/one","Output":"    --- SKIP: TestTable/one (0.00s)\n"}
{"Action":"skip","Package":"m/h","Test":"TestTable/one","Elapsed":0}
{"Action":"run","Package":"m/h","Test":"TestHelperProcess"}
{"Action":"output","Package":"m/h","Test":"TestHelperProcess","Output":"    helper_test.go:9: helper process for TestCrash\n"}
{"Action":"skip","Package":"m/h","Test":"TestHelperProcess","Elapsed":0}
{"Action":"skip","Package":"m/d","Elapsed":0}
`
	tests := []struct{ name, stream, want string }{
		{"skips and a helper", skips, "Skipped: 2 tests: h.TestNeedsRoot (needs root (mounts)); " +
			"h.TestTable/one (needs qemu-img (Debian package qemu-utils)) " +
			"(and 1 helper-process entries, which run only as their parent tests' children)"},
		{"none", stream, "Skipped: 0 tests (and 0 helper-process entries, which run only as their parent tests' children)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run, err := Read(strings.NewReader(tt.stream), nil)
			require.NoError(t, err)
			assert.Equal(t, tt.want, run.SkipLine("m/"))
		})
	}
}

func TestReplaceInDoc(t *testing.T) {
	run, err := Read(strings.NewReader(`{"Time":"2026-01-01T00:00:00Z","Action":"run","Package":"m/c","Test":"TestA"}
{"Time":"2026-01-01T00:01:30Z","Action":"pass","Package":"m/c","Test":"TestA","Elapsed":90}
{"Time":"2026-01-01T00:01:30Z","Action":"pass","Package":"m/c","Elapsed":90}
`), nil)
	require.NoError(t, err)
	doc := "# Title\n\n" + DocBegin + "\nold table\n" + DocEnd + "\nafter\n"
	got, err := ReplaceInDoc(doc, run, 5, "m/")
	require.NoError(t, err)
	assert.Contains(t, got, "# Title\n\n"+DocBegin+"\n\nRun of 2026-01-01 00:00 UTC: 90.0 s from the first event to the last. Skipped: 0 tests")
	assert.Contains(t, got, "| c.TestA | pass | 90.0 s |\n\n"+DocEnd+"\nafter\n")
	assert.NotContains(t, got, "old table")

	_, err = ReplaceInDoc("no markers", run, 5, "m/")
	assert.ErrorContains(t, err, "no \"<!-- test-times")
}
