package main

import (
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// pause ends, with 0, on SIGTERM or SIGINT only; a SIGCHLD is a reap.
func TestPauseStopsOnTermAndInt(t *testing.T) {
	for _, sig := range []os.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			sigs := make(chan os.Signal, 2)
			sigs <- syscall.SIGCHLD
			sigs <- sig
			done := make(chan int)
			go func() { done <- pause(sigs) }()
			select {
			case code := <-done:
				assert.Equal(t, 0, code)
			case <-time.After(5 * time.Second):
				t.Fatal("pause did not stop")
			}
		})
	}
}
