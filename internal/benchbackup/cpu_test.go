package benchbackup

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseStatCPU(t *testing.T) {
	tests := []struct {
		name, stat string
		want       time.Duration
		err        string
	}{
		{"a plain name", "42 (versitygw) S 1 42 42 0 -1 4194560 100 0 0 0 250 130 0 0 20 0 9 0 100 0 0", 3800 * time.Millisecond, ""},
		{"a name with spaces and parentheses", "7 (a (b) c) R 1 7 7 0 -1 0 0 0 0 0 5 5 0 0", 100 * time.Millisecond, ""},
		{"no name", "7 a R 1", 0, "no command name"},
		{"too short", "7 (a) R 1 2 3", 0, "want 13"},
		{"not a number", "7 (a) R 1 7 7 0 -1 0 0 0 0 0 x 5 0 0", 0, "invalid syntax"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStatCPU(tc.stat)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	t.Run("this process spends CPU", func(t *testing.T) {
		before, err := processCPU(os.Getpid())
		require.NoError(t, err)
		deadline := time.Now().Add(100 * time.Millisecond)
		for x := 0; time.Now().Before(deadline); x++ {
			_ = x * x
		}
		after, err := processCPU(os.Getpid())
		require.NoError(t, err)
		assert.Greater(t, after, before)
	})
}
