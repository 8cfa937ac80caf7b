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
	}{
		{name: "waits its time", ctx: context.Background(), d: time.Millisecond},
		{name: "no time: no wait", ctx: context.Background()},
		{name: "the context ended before", ctx: ended, d: time.Hour, want: context.Canceled},
		{name: "no time, the context ended", ctx: ended, want: context.Canceled},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := For(tc.ctx, tc.d); !errors.Is(err, tc.want) {
				t.Errorf("For = %v, want %v", err, tc.want)
			}
		})
	}
}
