package readywait

import (
	"strings"
	"testing"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
)

func TestFromQuery(t *testing.T) {
	cfg := config.ServerConfig{MaxReadyWait: 20 * time.Second}
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"", 0, false}, {"15", 15 * time.Second, false}, {"1.5", 1500 * time.Millisecond, false},
		{"20s", 20 * time.Second, false}, {"20", 20 * time.Second, false},
		{"21", 0, true}, {"30s", 0, true}, {"-1", 0, true}, {"soon", 0, true},
	}
	for _, tc := range tests {
		got, err := FromQuery(cfg, tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("FromQuery(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "20 seconds") {
			t.Errorf("FromQuery(%q): the error does not name the maximum: %v", tc.in, err)
		}
	}
}

func TestFromSeconds(t *testing.T) {
	cfg := config.ServerConfig{MaxReadyWait: 20 * time.Second}
	for _, tc := range []struct {
		secs    *float64
		want    time.Duration
		wantErr bool
	}{
		{nil, 0, false}, {ptr(0), 0, false}, {ptr(2.5), 2500 * time.Millisecond, false}, {ptr(20), 20 * time.Second, false},
		{ptr(20.5), 0, true}, {ptr(-1), 0, true},
	} {
		got, err := FromSeconds(cfg, tc.secs, "wait_seconds")
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("FromSeconds(%v) = %v, %v; want %v, error %v", tc.secs, got, err, tc.want, tc.wantErr)
		}
	}
}

func ptr(f float64) *float64 { return &f }
