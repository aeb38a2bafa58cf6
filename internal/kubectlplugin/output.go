package kubectlplugin

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"sigs.k8s.io/yaml"
)

// Output formats of -o.
const (
	formatTable = ""
	formatJSON  = "json"
	formatYAML  = "yaml"
)

func checkFormat(f string) error {
	switch f {
	case formatTable, "table", formatJSON, formatYAML:
		return nil
	}
	return fmt.Errorf("unknown output format %q: want json or yaml (or none, for tables)", f)
}

// write prints v as JSON or YAML, or calls table for the human form.
func write(w io.Writer, format string, v any, table func(io.Writer) error) error {
	switch format {
	case formatJSON:
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return fmt.Errorf("encoding JSON: %w", err)
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case formatYAML:
		b, err := yaml.Marshal(v)
		if err != nil {
			return fmt.Errorf("encoding YAML: %w", err)
		}
		_, err = w.Write(b)
		return err
	}
	return table(w)
}

// table is a kubectl-style table: upper-case headers, columns three
// spaces apart.
type table struct {
	tw *tabwriter.Writer
}

func newTable(w io.Writer, headers ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)}
	t.row(headers...)
	return t
}

func (t *table) row(cols ...string) {
	fmt.Fprintln(t.tw, strings.Join(cols, "\t"))
}

func (t *table) flush() error { return t.tw.Flush() }

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

func itoa[T ~int64 | ~int32 | ~uint64 | ~int](v T) string { return fmt.Sprint(v) }
