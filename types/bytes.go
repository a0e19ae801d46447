package types

import "fmt"

// ApproxBytes writes a byte count the way an admin reads it (1.9Gi),
// truncated rather than rounded: a figure just under a limit must not read
// as the limit.
func ApproxBytes(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%dB", n)
	}
	units := []string{"Ki", "Mi", "Gi", "Ti", "Pi"}
	v, unit := float64(n)/1024, units[0]
	for _, u := range units[1:] {
		if v < 1024 {
			break
		}
		v, unit = v/1024, u
	}
	tenths := int64(v * 10)
	if tenths%10 == 0 {
		return fmt.Sprintf("%d%s", tenths/10, unit)
	}
	return fmt.Sprintf("%d.%d%s", tenths/10, tenths%10, unit)
}
