// Package errclass re-labels an error with another layer's error class
// (errors.Is-able) while keeping its message: a replica's "snapshot not
// found" becomes dataconn.ErrNotFound on the wire and engineapi.ErrNotFound
// at the gRPC edge, and the user still reads the replica's words.
package errclass

import "errors"

// Rule maps errors that match From to the class To.
type Rule struct{ From, To error }

// Map returns err with the class of the first rule it matches added, or err
// unchanged (also when it already has that class).
func Map(err error, rules ...Rule) error {
	if err == nil {
		return nil
	}
	for _, r := range rules {
		if errors.Is(err, r.From) {
			if errors.Is(err, r.To) {
				return err
			}
			return &classified{err: err, class: r.To}
		}
	}
	return err
}

type classified struct{ err, class error }

func (c *classified) Error() string   { return c.err.Error() }
func (c *classified) Unwrap() []error { return []error{c.err, c.class} }
