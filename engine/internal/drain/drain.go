// Package drain gathers what a channel holds right now into one batch, so a
// server writes many queued replies with one system call. The NBD and
// dataconn servers share it.
package drain

// Into appends to b what ch holds now, without waiting, until b has max
// items or ch is empty or closed.
func Into[T any](ch <-chan T, b []T, max int) []T {
	for len(b) < max {
		select {
		case v, ok := <-ch:
			if !ok {
				return b
			}
			b = append(b, v)
		default:
			return b
		}
	}
	return b
}
