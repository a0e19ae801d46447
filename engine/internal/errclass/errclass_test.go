package errclass

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

var (
	errLow  = errors.New("low")
	errHigh = errors.New("high")
	errMid  = errors.New("mid")
)

func TestMap(t *testing.T) {
	rules := []Rule{{errLow, errHigh}, {errMid, errHigh}}
	tests := []struct {
		name    string
		in      error
		wantIs  []error
		wantMsg string
	}{
		{"matched error gains the class, keeps its message", fmt.Errorf("snapshot s1: %w", errLow), []error{errLow, errHigh}, "snapshot s1: low"},
		{"second rule", errMid, []error{errMid, errHigh}, "mid"},
		{"unmatched error is unchanged", errors.New("disk on fire"), nil, "disk on fire"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Map(tc.in, rules...)
			assert.EqualError(t, got, tc.wantMsg)
			for _, is := range tc.wantIs {
				assert.ErrorIs(t, got, is)
			}
		})
	}
	assert.NoError(t, Map(nil, rules...))
	already := fmt.Errorf("%w %w", errLow, errHigh)
	assert.Same(t, already, Map(already, rules...), "an error that has the class already is returned as is")
}
