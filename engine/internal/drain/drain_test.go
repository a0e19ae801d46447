package drain

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestInto(t *testing.T) {
	tests := []struct {
		name   string
		queued int
		closed bool
		max    int
		want   int
	}{
		{"takes what is queued", 3, false, 10, 4},
		{"stops at max", 20, false, 5, 5},
		{"empty does not wait", 0, false, 10, 1},
		{"closed channel ends the batch", 2, true, 10, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ch := make(chan int, 32)
			for i := 0; i < tc.queued; i++ {
				ch <- i
			}
			if tc.closed {
				close(ch)
			}
			assert.Len(t, Into(ch, []int{-1}, tc.max), tc.want)
		})
	}
}
