package types

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestApproxBytes(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0B", 1023: "1023B", 1024: "1Ki", 1536: "1.5Ki", 10 << 20: "10Mi",
		2040109465: "1.8Gi", 2<<30 - 1: "1.9Gi", 2 << 30: "2Gi", 3 << 40: "3Ti",
	} {
		assert.Equal(t, want, ApproxBytes(n), "%d bytes", n)
	}
}
