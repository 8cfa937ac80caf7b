// Package readywait is what every front door shares about waiting for a
// sandbox to become ready: how a wait is asked for, its bounds, and the
// deadline of a request that waits. One place, so the HTTP API, CloudEvents
// and POST / cannot disagree.
package readywait

import (
	"context"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
)

// decimalSeconds is the only spelling of seconds ?wait= takes: decimal
// digits, an optional fraction and exponent, an optional sign (so "-1" is
// told it is out of range).
// strconv.ParseFloat alone would also take "NaN", "Inf" and hex ("0x1p3"):
// NaN passes every comparison's range check and becomes a negative
// Duration, a deadline already past (a 504 for a request that was invalid).
var decimalSeconds = regexp.MustCompile(`^[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?$`)

// FromQuery reads the HTTP API's ?wait=: seconds ("15") or a Go duration
// ("15s"). Empty means do not wait.
func FromQuery(cfg config.ServerConfig, v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		v = strings.TrimSpace(v)
		secs, convErr := strconv.ParseFloat(v, 64)
		if convErr != nil || !decimalSeconds.MatchString(v) {
			return 0, api.Invalidf("wait %q must be seconds (15) or a duration (15s), at most %g seconds", api.Truncate(v), cfg.MaxReadyWait.Seconds())
		}
		return FromSeconds(cfg, &secs, "wait")
	}
	return bounded(cfg, d, "wait")
}

// FromSeconds reads the wait_seconds field of event and POST / data; nil
// means do not wait. field names it in the error. JSON has no NaN or
// infinity, but a caller in Go may pass one: NaN fails no comparison, so it
// is refused by name before the range check.
func FromSeconds(cfg config.ServerConfig, secs *float64, field string) (time.Duration, error) {
	if secs == nil {
		return 0, nil
	}
	if math.IsNaN(*secs) || *secs < 0 || *secs > cfg.MaxReadyWait.Seconds() {
		return 0, outOfRange(cfg, field)
	}
	return time.Duration(*secs * float64(time.Second)), nil
}

func bounded(cfg config.ServerConfig, d time.Duration, field string) (time.Duration, error) {
	if d < 0 || d > cfg.MaxReadyWait {
		return 0, outOfRange(cfg, field)
	}
	return d, nil
}

func outOfRange(cfg config.ServerConfig, field string) error {
	return api.Invalidf("%s must be between 0 and %g seconds (SANDBOX_MAX_READY_WAIT; the func runtime drops answers after 30 s)",
		field, cfg.MaxReadyWait.Seconds())
}

// Deadline bounds a request that waits for wait: the request timeout plus
// the wait, which configuration keeps within the runtime's write timeout.
func Deadline(ctx context.Context, cfg config.ServerConfig, wait time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, cfg.RequestTimeout+wait)
}
