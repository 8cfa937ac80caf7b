package resources

import (
	"testing"
	"time"
)

func TestExpiresAtIsTheEarlierDeadline(t *testing.T) {
	c := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := ExpiresAt(c, c.Add(50*time.Minute), 20*time.Minute, time.Hour); !got.Equal(c.Add(time.Hour)) {
		t.Errorf("lifetime cap not applied: %s", got)
	}
	if got := ExpiresAt(c, c.Add(10*time.Minute), 20*time.Minute, time.Hour); !got.Equal(c.Add(30 * time.Minute)) {
		t.Errorf("idle deadline not applied: %s", got)
	}
}
