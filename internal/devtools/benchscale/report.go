package benchscale

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// result is one row of the final table. A row without a target is
// information (a time to create, a floor); a row with one passes or misses.
type result struct {
	figure, value, target, verdict string
}

func (b *bench) info(figure, value string) {
	b.results = append(b.results, result{figure: figure, value: value, target: "—", verdict: "info"})
}

func (b *bench) check(figure, value, target string, ok bool) {
	verdict := "PASS"
	if !ok {
		verdict = "MISS"
	}
	b.results = append(b.results, result{figure: figure, value: value, target: target, verdict: verdict})
}

// missed reports whether any figure missed its target.
func (b *bench) missed() bool {
	for _, r := range b.results {
		if r.verdict == "MISS" {
			return true
		}
	}
	return false
}

// printTable prints every figure, its target and PASS/MISS.
func (b *bench) printTable(w io.Writer) {
	c := b.cfg
	fmt.Fprintf(w, "\nbench-scale: %d volumes × %d snapshots (%d replica(s), %s), %d writers, quiet window %s, %d latency samples\n\n",
		c.volumes, c.snapshots, c.replicas, c.size.String(), c.workers, c.quiet, c.latencySamples)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FIGURE\tVALUE\tTARGET\tRESULT")
	for _, r := range b.results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.figure, r.value, r.target, r.verdict)
	}
	tw.Flush()
	pass, miss := 0, 0
	for _, r := range b.results {
		switch r.verdict {
		case "PASS":
			pass++
		case "MISS":
			miss++
		}
	}
	fmt.Fprintf(w, "\n%d targets met, %d missed\n", pass, miss)
}

// fmtDur rounds a duration to what is worth reading.
func fmtDur(d time.Duration) string {
	switch {
	case d < 10*time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	case d < time.Minute:
		return d.Round(time.Millisecond).String()
	default:
		return d.Round(100 * time.Millisecond).String()
	}
}
