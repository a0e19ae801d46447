package kubectlstrata

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/yaml"
)

// printer writes what a command got: a table aligned like kubectl's, or
// with -o json|yaml the objects themselves.
type printer struct {
	out    io.Writer
	errOut io.Writer // for "No resources found.", as kubectl writes it
	format string    // "", json, yaml
	now    func() time.Time
}

func (p printer) check() error {
	switch p.format {
	case "", "json", "yaml":
		return nil
	}
	return fmt.Errorf("-o %q: want json or yaml (or nothing, for a table)", p.format)
}

// objects prints v as JSON or YAML when asked; false when a table is wanted.
func (p printer) objects(v any) (bool, error) {
	switch p.format {
	case "json":
		b, err := json.MarshalIndent(v, "", "    ")
		if err != nil {
			return true, err
		}
		_, err = fmt.Fprintln(p.out, string(b))
		return true, err
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return true, err
		}
		_, err = p.out.Write(b)
		return true, err
	}
	return false, nil
}

// table prints a header and rows with columns aligned, three spaces apart;
// with no rows, kubectl's "No resources found." on errOut and nothing on out.
func (p printer) table(header []string, rows [][]string) error {
	if len(rows) == 0 {
		_, err := fmt.Fprintln(p.errOut, "No resources found.")
		return err
	}
	w := tabwriter.NewWriter(p.out, 0, 8, 3, ' ', 0)
	fmt.Fprintln(w, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(w, strings.Join(r, "\t"))
	}
	return w.Flush()
}

// age is a creation time as kubectl shows it (5m, 2d).
func (p printer) age(t metav1.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(p.now().Sub(t.Time))
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

// size is a byte count as people read it: 3.2Mi, 4Mi, 512B.
func size(bytes int64) string {
	const unit = 1024
	if bytes < unit {
		return fmt.Sprintf("%dB", bytes)
	}
	value, i := float64(bytes), -1
	for value >= unit && i < 4 {
		value /= unit
		i++
	}
	return strings.TrimSuffix(fmt.Sprintf("%.1f", value), ".0") + []string{"Ki", "Mi", "Gi", "Ti", "Pi"}[i]
}

// listTable fetches a list from the API and prints it: as objects with
// -o, else a table of header and one row per item.
func listTable[T any](ctx context.Context, s *session, method, path string, header []string, row func(T) []string) error {
	var items struct {
		Items []T `json:"items"`
	}
	if err := s.call(ctx, method, path, nil, &items); err != nil {
		return err
	}
	if done, err := s.print.objects(items); done {
		return err
	}
	rows := make([][]string, 0, len(items.Items))
	for _, it := range items.Items {
		rows = append(rows, row(it))
	}
	return s.print.table(header, rows)
}
