package leader

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestTimings(t *testing.T) {
	for _, d := range []time.Duration{time.Second, 3 * time.Second, 20 * time.Second} {
		lease, renew, retry := Timings(d)
		assert.Equal(t, d, lease)
		assert.Less(t, renew, lease)
		assert.Less(t, time.Duration(float64(retry)*1.2), renew, "client-go's constraint")
	}
}
