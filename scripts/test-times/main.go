// Command test-times prints where a `go test -json` run's time went: every
// package and the slowest tests, as Markdown tables (docs/testing.md).
//
//	go test -json ./... | go run ./scripts/test-times -save .run/test.json
//	go run ./scripts/test-times -from .run/test.json
//	go run ./scripts/test-times -from bin/test.json -doc docs/testing.md
//
// Reading standard input it also relays what plain `go test` would print
// (package results, failed tests' output) and exits 1 when anything failed.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/strata-storage/strata/internal/devtools/testtimes"
)

const module = "github.com/strata-storage/strata/"

func main() {
	from := flag.String("from", "", "read this saved `go test -json` file instead of standard input, and relay nothing")
	save := flag.String("save", "", "also write the raw JSON stream to this file")
	slowest := flag.Int("slowest", 20, "how many of the slowest tests to list")
	doc := flag.String("doc", "", "with -from: write the tables into this Markdown file, between its "+
		testtimes.DocBegin+" and "+testtimes.DocEnd+" lines, instead of printing them")
	flag.Parse()
	var err error
	if *doc != "" {
		err = writeDoc(*from, *doc, *slowest)
	} else {
		err = run(*from, *save, *slowest)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "test-times:", err)
		os.Exit(1)
	}
}

// writeDoc regenerates the saved run's tables in doc (docs/testing.md).
func writeDoc(from, doc string, slowest int) error {
	if from == "" {
		return fmt.Errorf("-doc needs -from: the saved run to write down")
	}
	f, err := os.Open(from)
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := testtimes.Read(f, nil)
	if err != nil {
		return err
	}
	text, err := os.ReadFile(doc)
	if err != nil {
		return err
	}
	out, err := testtimes.ReplaceInDoc(string(text), r, slowest, module)
	if err != nil {
		return fmt.Errorf("%s: %w", doc, err)
	}
	return os.WriteFile(doc, []byte(out), 0o644)
}

func run(from, save string, slowest int) error {
	var in io.Reader = os.Stdin
	var relay io.Writer = os.Stdout
	if from != "" {
		f, err := os.Open(from)
		if err != nil {
			return err
		}
		defer f.Close()
		in, relay = f, nil
	}
	if save != "" {
		f, err := os.Create(save)
		if err != nil {
			return err
		}
		defer f.Close()
		in = io.TeeReader(in, f)
	}
	r, err := testtimes.Read(in, relay)
	if err != nil {
		return err
	}
	fmt.Println()
	r.Markdown(os.Stdout, slowest, module)
	fmt.Println()
	fmt.Println(r.SkipLine(module))
	fmt.Println()
	r.Failures(os.Stdout, module)
	if r.Failed && from == "" {
		return fmt.Errorf("tests failed")
	}
	return nil
}
