package sleep

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestFor(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name string
		ctx  context.Context
		d    time.Duration
		want error
		// waits: For must not answer before d has passed (a timer's
		// floor); else it must answer at once, long before d.
		waits bool
	}{
		{name: "waits its time", ctx: context.Background(), d: 20 * time.Millisecond, waits: true},
		{name: "no time: no wait", ctx: context.Background()},
		{name: "the context ended before", ctx: ended, d: time.Hour, want: context.Canceled},
		{name: "no time, the context ended", ctx: ended, want: context.Canceled},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			err := For(tc.ctx, tc.d)
			took := time.Since(start)
			if !errors.Is(err, tc.want) {
				t.Errorf("For = %v, want %v", err, tc.want)
			}
			if tc.waits && took < tc.d {
				t.Errorf("For(%s) answered after %s, before its time", tc.d, took)
			}
			if !tc.waits && took >= time.Second {
				t.Errorf("For(%s) answered after %s, want at once", tc.d, took)
			}
		})
	}
}
