package app

import (
	"context"
	"errors"
	"sync"
)

// runner is what every controller offers: workers on its queues until ctx ends.
type runner interface {
	Run(ctx context.Context, workers int)
}

// controllerSet collects the manager's controllers as they are built, so
// registering one takes one line: set.add(controller.NewXController(...)).
// The first construction error is kept; run starts them all.
type controllerSet struct {
	workers int
	err     error
	runs    []func(ctx context.Context)
}

// add registers a controller with the configured number of workers.
func (s *controllerSet) add(c runner, err error) { s.addWith(s.workers, c, err) }

// single registers a controller with one worker (one object per node).
func (s *controllerSet) single(c runner, err error) { s.addWith(1, c, err) }

func (s *controllerSet) addWith(workers int, c runner, err error) {
	if err != nil {
		s.err = errors.Join(s.err, err)
		return
	}
	s.runs = append(s.runs, func(ctx context.Context) { c.Run(ctx, workers) })
}

// run starts every controller in wg.
func (s *controllerSet) run(ctx context.Context, wg *sync.WaitGroup) {
	for _, r := range s.runs {
		wg.Go(func() { r(ctx) })
	}
}
