package benchkbench

import (
	"fmt"
	"io"
	"strings"
)

// target is one column of the table: where fio ran and what it got.
type target struct {
	name    string // column heading
	figures figures
}

// row is one measurement of the table.
type row struct {
	label string
	unit  string
	get   func(figures) float64
	// lowerIsBetter: latency; the ratio is still target/baseline.
	lowerIsBetter bool
}

var rows = []row{
	{"random read, 4 KiB qd16", "IOPS", func(f figures) float64 { return f.RandReadIOPS }, false},
	{"random write, 4 KiB qd16", "IOPS", func(f figures) float64 { return f.RandWriteIOPS }, false},
	{"sequential read, 1 MiB qd16", "MiB/s", func(f figures) float64 { return f.SeqReadMiBs }, false},
	{"sequential write, 1 MiB qd16", "MiB/s", func(f figures) float64 { return f.SeqWriteMiBs }, false},
	{"read latency p50, 4 KiB qd1", "µs", func(f figures) float64 { return f.ReadP50us }, true},
	{"read latency p99, 4 KiB qd1", "µs", func(f figures) float64 { return f.ReadP99us }, true},
	{"write latency p50, 4 KiB qd1", "µs", func(f figures) float64 { return f.WriteP50us }, true},
	{"write latency p99, 4 KiB qd1", "µs", func(f figures) float64 { return f.WriteP99us }, true},
}

// writeTable prints a Markdown table: a row per measurement, a column per
// target, each figure with its ratio to the first target (the baseline).
func writeTable(w io.Writer, targets []target) {
	head := []string{"measurement", "unit"}
	sep := []string{"---", "---"}
	for _, t := range targets {
		head = append(head, t.name)
		sep = append(sep, "---:")
	}
	fmt.Fprintf(w, "| %s |\n| %s |\n", strings.Join(head, " | "), strings.Join(sep, " | "))
	for _, r := range rows {
		cells := []string{r.label, r.unit}
		base := r.get(targets[0].figures)
		for i, t := range targets {
			v := r.get(t.figures)
			cell := formatFigure(v)
			if i > 0 && base > 0 {
				cell += fmt.Sprintf(" (%.2f×)", v/base)
			}
			cells = append(cells, cell)
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
}

func formatFigure(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}
