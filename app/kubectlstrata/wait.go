package kubectlstrata

import (
	"context"
	"fmt"
	"os"
	"time"

	"golang.org/x/term"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// fill is how filling a new volume (a clone or a restore) goes.
type fill struct {
	state    string
	progress int32
	done     bool
	err      error
}

// fillOf reads a volume's clone or restore status; ok is false while it
// has none yet.
func fillOf(v *v1beta1.Volume) (f fill, ok bool) {
	switch {
	case v.Status.RestoreStatus != nil:
		st := v.Status.RestoreStatus
		f = fill{state: string(st.State), progress: st.Progress, done: st.State == v1beta1.VolumeRestoreStateCompleted}
		if st.State == v1beta1.VolumeRestoreStateFailed {
			f.err = fmt.Errorf("the restore failed: %s", st.Message)
		}
		return f, true
	case v.Status.CloneStatus != nil:
		st := v.Status.CloneStatus
		f = fill{state: string(st.State), progress: st.Progress, done: st.State == v1beta1.VolumeCloneStateCompleted}
		if st.State == v1beta1.VolumeCloneStateFailed {
			f.err = fmt.Errorf("the clone failed: %s", st.Message)
		}
		return f, true
	}
	return fill{}, false
}

// waitFilled follows a volume being cloned or restored until it is done:
// a progress line redrawn on a terminal, a plain line at each change of
// state or tenth of progress otherwise.
func (s *session) waitFilled(ctx context.Context, volume, what string) error {
	tty := term.IsTerminal(int(os.Stderr.Fd()))
	lastState, lastTenth := "", int32(-1)
	for {
		var v v1beta1.Volume
		if err := s.call(ctx, "GET", "/v1/volumes/"+volume, nil, &v); err != nil {
			return err
		}
		if f, ok := fillOf(&v); ok {
			if f.err != nil {
				return fmt.Errorf("volume/%s: %w", volume, f.err)
			}
			line := fmt.Sprintf("volume/%s: %s %s %d%%", volume, what, f.state, f.progress)
			switch {
			case tty:
				fmt.Fprintf(os.Stderr, "\r%s   ", line)
			case f.state != lastState || f.progress/10 != lastTenth:
				fmt.Fprintln(os.Stderr, line)
			}
			lastState, lastTenth = f.state, f.progress/10
			if f.done {
				if tty {
					fmt.Fprintln(os.Stderr)
				}
				return s.line("volume/%s: %s completed", volume, what)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
