package app

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
)

type fakeRunner struct {
	mu      sync.Mutex
	workers int
}

func (f *fakeRunner) Run(_ context.Context, workers int) {
	f.mu.Lock()
	f.workers = workers
	f.mu.Unlock()
}

func TestControllerSet(t *testing.T) {
	tests := []struct {
		name        string
		errs        []error
		wantErr     string
		wantWorkers []int
	}{
		{name: "all built: each runs with its workers", errs: []error{nil, nil}, wantWorkers: []int{3, 1}},
		{name: "a construction error is kept; a controller that failed to build is not in the set", errs: []error{errors.New("informer handler"), nil},
			wantErr: "informer handler", wantWorkers: []int{0, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			set := &controllerSet{workers: 3}
			a, b := &fakeRunner{}, &fakeRunner{}
			set.add(a, tc.errs[0])
			set.single(b, tc.errs[1])
			if tc.wantErr != "" {
				assert.ErrorContains(t, set.err, tc.wantErr)
			} else {
				assert.NoError(t, set.err)
			}
			var wg sync.WaitGroup
			set.run(context.Background(), &wg)
			wg.Wait()
			assert.Equal(t, tc.wantWorkers, []int{a.workers, b.workers})
		})
	}
}
