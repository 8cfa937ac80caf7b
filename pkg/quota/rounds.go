package quota

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/sleep"
)

// maxRetries bounds the rounds a create spends on a contended count.
const maxRetries = 4

// retryRoom is what a retry needs before the request's deadline, after
// its backoff: one more slot, count and workload, with room to spare on a
// busy API server.
var retryRoom = time.Second

// Rounds runs create, one attempt at a sandbox, until a contended count
// (racing creates at the limit refusing each other: Error.Contended) stops
// refusing it, at most maxRetries times more. Each retry backs off for a
// random moment, so that the next round admits some of the racers, and
// creates again only once a count shows room, so that a limit full of
// young sandboxes does not cost a workload made and removed per round.
//
// When the request's deadline leaves no room for another round, or ends
// one, the refusal stands: the create answers 429, not a timeout (504)
// that would blame the API server for a limit the racers filled.
func (c *Counter) Rounds(ctx context.Context, s api.Spec, create func() error) error {
	var refused *Error
	for attempt := 0; ; attempt++ {
		var err error
		if attempt > 0 {
			backoff := time.Duration(attempt) * time.Duration(50+rand.IntN(150)) * time.Millisecond
			if d, ok := ctx.Deadline(); ok && time.Until(d) < backoff+retryRoom {
				return refused
			}
			if err := sleep.For(ctx, backoff); err != nil {
				return api.Classify(err, "create the sandbox")
			}
			err = c.Check(ctx, s, nil)
		}
		if err == nil {
			err = create()
		}
		var qe *Error
		switch {
		case errors.As(err, &qe) && qe.Contended && attempt < maxRetries:
			refused = qe
		case refused != nil && qe == nil && err != nil && ctx.Err() != nil:
			return refused // what the cut round wrote, the create undoes
		default:
			return err
		}
	}
}
