package eventlimit

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

type counting struct{ reasons []string }

func (c *counting) Eventf(_ runtime.Object, _, reason, _ string, _ ...interface{}) {
	c.reasons = append(c.reasons, reason)
}

func TestBurstThenDrop(t *testing.T) {
	tests := []struct {
		name          string
		burst, events int
		wantPassed    int
	}{
		{"within the burst", 5, 3, 3},
		{"beyond the burst", 5, 12, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next := &counting{}
			dropped := 0
			// A rate so low no token comes back during the test.
			l := New(next, 1e-9, tt.burst, func() { dropped++ })
			for i := 0; i < tt.events; i++ {
				l.Eventf(&corev1.Pod{}, corev1.EventTypeNormal, "Created", "sandbox %d", i)
			}
			got := map[string]int{"passed": len(next.reasons), "dropped": dropped}
			want := map[string]int{"passed": tt.wantPassed, "dropped": tt.events - tt.wantPassed}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
