// Command test-times prints where a `go test -json` run's time went: every
// package and the slowest tests, as Markdown tables (docs/testing.md).
//
//	go test -json ./... | go run ./scripts/test-times -save .run/test.json
//	go run ./scripts/test-times -from .run/test.json
//
// Reading standard input it also relays what plain `go test` would print
// (package results, failed tests' output) and exits 1 when anything failed.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/strata-storage/strata/internal/testtimes"
)

const module = "github.com/strata-storage/strata/"

func main() {
	from := flag.String("from", "", "read this saved `go test -json` file instead of standard input, and relay nothing")
	save := flag.String("save", "", "also write the raw JSON stream to this file")
	slowest := flag.Int("slowest", 20, "how many of the slowest tests to list")
	flag.Parse()
	if err := run(*from, *save, *slowest); err != nil {
		fmt.Fprintln(os.Stderr, "test-times:", err)
		os.Exit(1)
	}
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
	r.Failures(os.Stdout, module)
	if r.Failed && from == "" {
		return fmt.Errorf("tests failed")
	}
	return nil
}
