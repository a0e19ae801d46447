// Package conformance runs Kubernetes' own storage e2e suite, the External
// Storage tests of k8s.io/kubernetes' test/e2e, against Strata installed
// with its Helm chart on the local cluster (make test-conformance; the run
// itself is TestExternalStorage, which does nothing unless asked). This file
// reads the suite's JUnit report into counts per test suite and pattern;
// kubeletpods.go makes the nodes' pod directories visible where the suite
// looks for them.
package conformance

import (
	"encoding/xml"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
)

// Result is one External Storage spec of a run.
type Result struct {
	Name    string // the spec's full text, tags included
	Suite   string // the test suite: provisioning, volumeMode, snapshottable, ...
	Pattern string // the test pattern: Dynamic PV (default fs), ...
	State   State
	// Message: a failure's first lines, or the suite's own reason for a
	// skip it decided at run time ("" for one the run's filter left out).
	Message string
	Seconds float64
}

// State is how a spec ended.
type State string

const (
	Passed  State = "passed"
	Failed  State = "failed" // also timed out, interrupted, aborted, panicked
	Skipped State = "skipped"
)

// junitCase is the part of a ginkgo JUnit <testcase> used here.
type junitCase struct {
	Name    string  `xml:"name,attr"`
	Status  string  `xml:"status,attr"`
	Time    float64 `xml:"time,attr"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
	Failure *junitText `xml:"failure"`
	Error   *junitText `xml:"error"`
}

type junitText struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Text    string `xml:",chardata"`
}

// ReadJUnit reads the External Storage specs of a ginkgo JUnit report (the
// suite's junit_01.xml), whatever else the binary holds, in report order.
func ReadJUnit(path string) ([]Result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc struct {
		Suites []struct {
			Cases []junitCase `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []Result
	for _, s := range doc.Suites {
		for _, c := range s.Cases {
			// "[It] External Storage [Driver: …] …"; suite setup and
			// report nodes have other leaf types.
			text, ok := strings.CutPrefix(c.Name, "[It] ")
			if !ok || !strings.Contains(text, "External Storage") {
				continue
			}
			r := Result{Name: text, Seconds: c.Time}
			r.Suite, r.Pattern = suiteAndPattern(text)
			r.State, r.Message = caseState(c)
			out = append(out, r)
		}
	}
	return out, nil
}

// patternRE finds the test pattern and the suite name after it in a spec's
// text: "[Testpattern: Dynamic PV (block volmode)] volumeMode should …".
var patternRE = regexp.MustCompile(`\[Testpattern: ([^\]]*)\] (\S+)`)

func suiteAndPattern(text string) (suite, pattern string) {
	m := patternRE.FindStringSubmatch(text)
	if m == nil {
		return "-", "-"
	}
	return m[2], strings.TrimSpace(m[1])
}

func caseState(c junitCase) (State, string) {
	switch {
	case c.Status == "passed":
		return Passed, ""
	case c.Status == "skipped" || c.Status == "pending" || (c.Status == "" && c.Skipped != nil):
		msg := ""
		if c.Skipped != nil {
			msg = strings.TrimPrefix(strings.TrimPrefix(c.Skipped.Message, "skipped"), " - ")
		}
		return Skipped, msg
	case c.Failure != nil:
		return Failed, failureLines(c.Status, c.Failure)
	case c.Error != nil:
		return Failed, failureLines(c.Status, c.Error)
	default:
		return Failed, c.Status
	}
}

// failureLines is a failure's status and the first lines of its text (the
// report leaves the message attribute out and writes it in the text).
func failureLines(status string, t *junitText) string {
	text := strings.TrimSpace(t.Message + "\n" + t.Text)
	lines := strings.Split(text, "\n")
	if len(lines) > 8 {
		lines = append(lines[:8], "…")
	}
	return status + ": " + strings.Join(lines, "\n")
}

// Count is a tally of results.
type Count struct{ Passed, Failed, Skipped int }

func (c *Count) add(s State) {
	switch s {
	case Passed:
		c.Passed++
	case Failed:
		c.Failed++
	default:
		c.Skipped++
	}
}

// Ran is how many specs ran (passed or failed).
func (c Count) Ran() int { return c.Passed + c.Failed }

// Row is a suite and pattern's count.
type Row struct {
	Suite, Pattern string
	Count
}

// Tally counts the results per suite and pattern (rows sorted by suite,
// then pattern) and in all. Specs the run's filter left out (skipped with no
// reason of the suite's) are counted apart in filtered, not as skips.
func Tally(results []Result) (rows []Row, total Count, filtered int) {
	index := map[[2]string]int{}
	for _, r := range results {
		if r.State == Skipped && r.Message == "" {
			filtered++
			continue
		}
		key := [2]string{r.Suite, r.Pattern}
		i, ok := index[key]
		if !ok {
			i = len(rows)
			index[key] = i
			rows = append(rows, Row{Suite: r.Suite, Pattern: r.Pattern})
		}
		rows[i].add(r.State)
		total.add(r.State)
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].Suite != rows[j].Suite {
			return rows[i].Suite < rows[j].Suite
		}
		return rows[i].Pattern < rows[j].Pattern
	})
	return rows, total, filtered
}

// Table is the tally as a Markdown table, total last.
func Table(rows []Row, total Count) string {
	var b strings.Builder
	b.WriteString("| suite | pattern | passed | failed | skipped |\n|---|---|---:|---:|---:|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d |\n", r.Suite, r.Pattern, r.Passed, r.Failed, r.Skipped)
	}
	fmt.Fprintf(&b, "| **all** | | **%d** | **%d** | **%d** |\n", total.Passed, total.Failed, total.Skipped)
	return b.String()
}

// SkipReasons groups the suite's own skip messages: each reason with the
// specs it skipped, reasons sorted by how many specs they skipped.
func SkipReasons(results []Result) []Reason {
	index := map[string]int{}
	var out []Reason
	for _, r := range results {
		if r.State != Skipped || r.Message == "" {
			continue
		}
		i, ok := index[r.Message]
		if !ok {
			i = len(out)
			index[r.Message] = i
			out = append(out, Reason{Message: r.Message})
		}
		out[i].Specs = append(out[i].Specs, r.Suite+" / "+r.Pattern)
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i].Specs) > len(out[j].Specs) })
	return out
}

// Reason is one skip message of the suite and where it applied.
type Reason struct {
	Message string
	Specs   []string // "suite / pattern", once per spec
}
