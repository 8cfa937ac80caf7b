package readywait

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
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

// TestNotANumberIsInvalid: spellings strconv.ParseFloat takes but that are
// no decimal seconds are refused as invalid (422), before any wait: NaN
// passed the range check and became a negative wait, a deadline already
// past, so the request ended as a 504.
func TestNotANumberIsInvalid(t *testing.T) {
	cfg := config.ServerConfig{MaxReadyWait: 20 * time.Second}
	type result struct {
		Wait time.Duration
		Kind api.Kind // -1: no error
	}
	tests := []struct {
		in   string
		want result
	}{
		{"NaN", result{Kind: api.KindInvalid}},
		{"nan", result{Kind: api.KindInvalid}},
		{"-NaN", result{Kind: api.KindInvalid}},
		{"Inf", result{Kind: api.KindInvalid}},
		{"+Inf", result{Kind: api.KindInvalid}},
		{"-Inf", result{Kind: api.KindInvalid}},
		{"Infinity", result{Kind: api.KindInvalid}},
		{"0x1p3", result{Kind: api.KindInvalid}},
		{"0X8", result{Kind: api.KindInvalid}},
		{"0x_1p3", result{Kind: api.KindInvalid}},
		{"1e400", result{Kind: api.KindInvalid}},
		{"1_0", result{Kind: api.KindInvalid}},
		// Decimal spellings still wait.
		{"8", result{Wait: 8 * time.Second, Kind: -1}},
		{" 8 ", result{Wait: 8 * time.Second, Kind: -1}},
		{"8.", result{Wait: 8 * time.Second, Kind: -1}},
		{".5", result{Wait: 500 * time.Millisecond, Kind: -1}},
		{"1e1", result{Wait: 10 * time.Second, Kind: -1}},
		{"+2.5", result{Wait: 2500 * time.Millisecond, Kind: -1}},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			d, err := FromQuery(cfg, tc.in)
			got := result{Wait: d, Kind: -1}
			if err != nil {
				got.Kind = api.KindOf(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("FromQuery(%q) (-want +got):\n%s", tc.in, diff)
			}
		})
	}
	for _, f := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		if d, err := FromSeconds(cfg, &f, "wait_seconds"); api.KindOf(err) != api.KindInvalid || !strings.Contains(err.Error(), "wait_seconds") {
			t.Errorf("FromSeconds(%v) = %v, %v; want a 422 naming wait_seconds", f, d, err)
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
