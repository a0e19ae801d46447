package benchbackup

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProcessCPU(t *testing.T) {
	t.Run("grows while the process works", func(t *testing.T) {
		before, err := processCPU(os.Getpid())
		require.NoError(t, err)
		// Work the kernel charges in 10 ms ticks: tens of them.
		sum := 0
		for x := range 1 << 29 {
			sum += x ^ (x >> 3)
		}
		after, err := processCPU(os.Getpid())
		require.NoError(t, err)
		assert.Greater(t, after, before+20*time.Millisecond, "work of %d", sum)
	})
	t.Run("a process that does not exist is an error", func(t *testing.T) {
		_, err := processCPU(1 << 30)
		assert.Error(t, err)
	})
}
