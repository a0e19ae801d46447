// Package testtimes reads `go test -json` output: it relays what a reader
// of plain `go test` would want to see (package results, and the output of
// whatever failed) and gathers per-package and per-test wall times, so
// `make test` leaves a table of where its minutes went (docs/testing.md).
//
// gotestsum does the relaying well, but it is one more tool for a fresh
// machine to fetch; what is needed here is small.
package testtimes

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json's TestEvent).
type event struct {
	Time       time.Time
	Action     string
	Package    string
	ImportPath string // a build's events name the package here
	Test       string
	Elapsed    float64
	Output     string
}

// Result is one package's or one top-level test's end.
type Result struct {
	Package string
	Test    string // empty for a package
	Action  string // pass, fail or skip
	Elapsed time.Duration
}

// Name is "pkg" or "pkg.Test".
func (r Result) Name() string {
	if r.Test == "" {
		return r.Package
	}
	return r.Package + "." + r.Test
}

// Run is everything gathered from one `go test -json` stream.
type Run struct {
	Packages []Result
	Tests    []Result // top-level tests only: a subtest's time is in its parent's
	Failed   bool

	// BuildFailed names the packages that did not build; PackageTail
	// keeps the last lines a failed package printed outside its tests
	// (TestMain's own checks, a panic, a timeout), for Failures.
	BuildFailed []string
	PackageTail map[string][]string

	// Skipped is every skipped test or subtest, with the reason it gave.
	Skipped []Skip

	// first and last are the times of the stream's first and last events.
	first, last time.Time

	// started is when each running test last began or resumed: a test's
	// own Elapsed leaves out its parallel subtests (they run after it
	// returns) and a paused parallel test's wait counts in neither.
	started map[string]time.Time
}

// relay keeps each test's output until it ends, so that a failed test's
// lines come out together, as plain `go test` prints them.
type relay struct {
	out     io.Writer
	pending map[string][]string // package or package.Test -> output lines
}

func (r *relay) keep(key, line string) { r.pending[key] = append(r.pending[key], line) }

func (r *relay) flush(key string, print bool) {
	if print {
		for _, l := range r.pending[key] {
			fmt.Fprint(r.out, l)
		}
	}
	delete(r.pending, key)
}

// Read consumes a `go test -json` stream. When out is not nil it writes
// each package's summary line and the output of every failed test or
// package to it as they end; lines that are not JSON (a build failure's
// compiler output) are passed through at once.
func Read(in io.Reader, out io.Writer) (*Run, error) {
	if out == nil {
		out = io.Discard
	}
	run := &Run{started: map[string]time.Time{}, PackageTail: map[string][]string{}}
	rl := &relay{out: out, pending: map[string][]string{}}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var ev event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &ev) != nil {
			fmt.Fprintf(out, "%s\n", line)
			continue
		}
		run.add(rl, ev)
	}
	return run, sc.Err()
}

func (run *Run) add(rl *relay, ev event) {
	if !ev.Time.IsZero() {
		if run.first.IsZero() {
			run.first = ev.Time
		}
		run.last = ev.Time
	}
	key := ev.Package
	if ev.Test != "" {
		key += "." + ev.Test
	}
	switch ev.Action {
	case "build-output":
		// Since Go 1.24 a failed build is reported in the stream too.
		fmt.Fprint(rl.out, ev.Output)
	case "build-fail":
		run.Failed = true
		run.BuildFailed = append(run.BuildFailed, ev.ImportPath)
	case "output":
		rl.keep(key, ev.Output)
	case "run", "cont":
		run.started[key] = ev.Time
	case "pass", "fail", "skip":
		res := Result{Package: ev.Package, Test: ev.Test, Action: ev.Action,
			Elapsed: time.Duration(ev.Elapsed * float64(time.Second))}
		if at, ok := run.started[key]; ok && ev.Test != "" && !at.IsZero() && ev.Time.Sub(at) > res.Elapsed {
			res.Elapsed = ev.Time.Sub(at)
		}
		delete(run.started, key)
		if ev.Action == "skip" && ev.Test != "" {
			run.Skipped = append(run.Skipped, Skip{Result: res, Reason: skipReason(rl.pending[key])})
		}
		if ev.Action == "fail" {
			run.Failed = true
		}
		switch {
		case ev.Test == "":
			// The package's own lines hold its summary ("ok", "FAIL")
			// and whatever it printed outside a test; plain go test does
			// not print a passing package's "PASS".
			if ev.Action == "pass" {
				rl.pending[key] = slices.DeleteFunc(rl.pending[key], func(l string) bool { return l == "PASS\n" })
			}
			if ev.Action == "fail" {
				lines := rl.pending[key]
				run.PackageTail[key] = slices.Clone(lines[max(0, len(lines)-tailLines):])
			}
			rl.flush(key, true)
			run.Packages = append(run.Packages, res)
		case !strings.Contains(ev.Test, "/"):
			rl.flush(key, ev.Action == "fail")
			run.Tests = append(run.Tests, res)
		default:
			// A subtest's lines are its parent's too: the parent prints
			// them if it fails.
			parent := ev.Package + "." + ev.Test[:strings.Index(ev.Test, "/")]
			rl.pending[parent] = append(rl.pending[parent], rl.pending[key]...)
			rl.flush(key, false)
		}
	}
}

// Skip is a skipped test and the reason it gave (t.Skip's words).
type Skip struct {
	Result
	Reason string
}

// helperPrefix starts the reason a test binary's helper-process entry
// gives when run as a test (the os/exec idiom): those are not tests that
// could not run, and are counted apart.
const helperPrefix = "helper process"

// skipReason is the last line a skipped test printed before its
// "--- SKIP" line, without the file:line prefix t.Skip adds.
func skipReason(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "--- SKIP") || strings.HasPrefix(l, "=== ") {
			continue
		}
		if _, after, ok := strings.Cut(l, ".go:"); ok {
			if _, reason, ok := strings.Cut(after, ": "); ok {
				return reason
			}
		}
		return l
	}
	return "(no reason given)"
}

// SkipLine is make test's one line on what did not run: the count of
// skipped tests, each with its reason, and the helper processes apart.
func (run *Run) SkipLine(trim string) string {
	var tests []string
	helpers := 0
	for _, s := range run.Skipped {
		if strings.HasPrefix(s.Reason, helperPrefix) {
			helpers++
			continue
		}
		tests = append(tests, fmt.Sprintf("%s (%s)", strings.TrimPrefix(s.Name(), trim), s.Reason))
	}
	line := fmt.Sprintf("Skipped: %d tests", len(tests))
	if len(tests) > 0 {
		line += ": " + strings.Join(tests, "; ")
	}
	return line + fmt.Sprintf(" (and %d helper-process entries, which run only as their parent tests' children)", helpers)
}

// tailLines is how much of a failed package's own output Failures repeats:
// enough for TestMain's reasons, which it prints last.
const tailLines = 20

// Failures writes what failed, once more, after everything else: a long
// run's log is often seen only by its end (a CI page), where a failure
// relayed twenty minutes earlier is out of sight. A package that failed
// with none of its tests failing failed in TestMain, a panic or a
// timeout: its last lines are repeated.
func (run *Run) Failures(w io.Writer, trim string) {
	if !run.Failed {
		return
	}
	fmt.Fprintln(w, "What failed:")
	for _, p := range run.BuildFailed {
		fmt.Fprintf(w, "- %s: did not build (its compiler output is above)\n", strings.TrimPrefix(p, trim))
	}
	failedTests := map[string]bool{}
	for _, t := range run.Tests {
		if t.Action == "fail" {
			failedTests[t.Package] = true
			fmt.Fprintf(w, "- %s (its output is above)\n", strings.TrimPrefix(t.Name(), trim))
		}
	}
	for _, p := range run.Packages {
		if p.Action != "fail" || failedTests[p.Package] {
			continue
		}
		fmt.Fprintf(w, "- %s: failed outside its tests (TestMain, a panic or a timeout); its last lines:\n", strings.TrimPrefix(p.Package, trim))
		for _, l := range run.PackageTail[p.Package] {
			fmt.Fprintf(w, "    %s", l)
		}
	}
}

// Slowest returns the n longest results, longest first.
func Slowest(rs []Result, n int) []Result {
	s := slices.Clone(rs)
	slices.SortStableFunc(s, func(a, b Result) int { return int(b.Elapsed - a.Elapsed) })
	if len(s) > n {
		s = s[:n]
	}
	return s
}

// Markdown writes the packages (longest first) and the n slowest tests as
// two Markdown tables, with trim cut from the front of package paths.
func (run *Run) Markdown(w io.Writer, n int, trim string) {
	var sum time.Duration
	var tested []Result
	for _, p := range run.Packages {
		sum += p.Elapsed
		if p.Action != "skip" { // a package without test files
			tested = append(tested, p)
		}
	}
	fmt.Fprintf(w, "| package | result | wall time |\n|---|---|---:|\n")
	for _, p := range Slowest(tested, len(tested)) {
		fmt.Fprintf(w, "| %s | %s | %s |\n", strings.TrimPrefix(p.Package, trim), p.Action, seconds(p.Elapsed))
	}
	fmt.Fprintf(w, "| (sum over packages; go test runs as many at once as there are cores) | | %s |\n\n", seconds(sum))
	fmt.Fprintf(w, "| test | result | wall time |\n|---|---|---:|\n")
	for _, t := range Slowest(run.Tests, n) {
		fmt.Fprintf(w, "| %s | %s | %s |\n", strings.TrimPrefix(t.Name(), trim), t.Action, seconds(t.Elapsed))
	}
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

// The lines that fence the generated tables in a Markdown file.
const (
	DocBegin = "<!-- test-times: generated from bin/test.json by scripts/test-times -doc; do not edit -->"
	DocEnd   = "<!-- test-times: end -->"
)

// ReplaceInDoc puts the run's summary and tables between doc's DocBegin
// and DocEnd lines.
func ReplaceInDoc(doc string, run *Run, slowest int, trim string) (string, error) {
	begin := strings.Index(doc, DocBegin)
	end := strings.Index(doc, DocEnd)
	if begin < 0 || end < begin {
		return "", fmt.Errorf("no %q line followed by a %q line", DocBegin, DocEnd)
	}
	var b strings.Builder
	b.WriteString(DocBegin + "\n\n")
	fmt.Fprintf(&b, "Run of %s: %s from the first event to the last. %s.\n\n",
		run.first.UTC().Format("2006-01-02 15:04 UTC"), seconds(run.last.Sub(run.first)), run.SkipLine(trim))
	run.Markdown(&b, slowest, trim)
	b.WriteString("\n")
	return doc[:begin] + b.String() + doc[end:], nil
}
