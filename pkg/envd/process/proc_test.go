package process

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	pb "github.com/deerflow-sandbox/provisioner/pkg/envd/gen/process"
)

// pump's start event waits for the first further event up to its hold,
// and no longer.
func TestPumpHoldsStart(t *testing.T) {
	end := &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: &pb.ProcessEvent_EndEvent{Exited: true, Status: "exit status 0"}}}
	out := &pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stdout{Stdout: []byte("hi")}}}}
	for _, tc := range []struct {
		name   string
		hold   time.Duration
		events []*pb.ProcessEvent // queued before pump starts
		// wantBeforeEnd is what was sent by the time the test ends the
		// process (after a while longer than the hold, if any).
		wantBeforeEnd []string
		want          []string
	}{
		{name: "quick end leaves with the start", hold: time.Hour, events: []*pb.ProcessEvent{end}, want: []string{"start", "end"}},
		{name: "first output releases the start", hold: time.Hour, events: []*pb.ProcessEvent{out}, wantBeforeEnd: []string{"start", "data"}, want: []string{"start", "data", "end"}},
		{name: "silent process: start after the hold", hold: 10 * time.Millisecond, wantBeforeEnd: []string{"start"}, want: []string{"start", "end"}},
		{name: "no hold", wantBeforeEnd: []string{"start"}, want: []string{"start", "end"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &proc{pid: 42, subs: map[*subscriber]struct{}{}, ended: make(chan struct{})}
			sub, _ := p.subscribe()
			for _, ev := range tc.events {
				sub.ch <- ev
			}
			sent := make(chan string, 8)
			done := make(chan error, 1)
			go func() {
				done <- pump(context.Background(), p, sub, 0, tc.hold, func(ev *pb.ProcessEvent) error {
					switch ev.GetEvent().(type) {
					case *pb.ProcessEvent_Start:
						sent <- "start"
					case *pb.ProcessEvent_Data:
						sent <- "data"
					case *pb.ProcessEvent_End:
						sent <- "end"
					}
					return nil
				})
			}()
			var got []string
			if tc.wantBeforeEnd != nil {
				for range tc.wantBeforeEnd {
					select {
					case s := <-sent:
						got = append(got, s)
					case <-time.After(5 * time.Second):
						t.Fatalf("sent %v, then nothing for 5 s; want %v before the end", got, tc.wantBeforeEnd)
					}
				}
				if diff := cmp.Diff(tc.wantBeforeEnd, got); diff != "" {
					t.Errorf("sent before the end (-want +got):\n%s", diff)
				}
				sub.ch <- end
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("pump: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("pump did not return within 5 s of the end event")
			}
			close(sent)
			for s := range sent {
				got = append(got, s)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("sent (-want +got):\n%s", diff)
			}
		})
	}
}

// A cancelled stream ends pump during the hold.
func TestPumpHoldEndsWithContext(t *testing.T) {
	p := &proc{pid: 42, subs: map[*subscriber]struct{}{}, ended: make(chan struct{})}
	sub, _ := p.subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := pump(ctx, p, sub, 0, time.Hour, func(*pb.ProcessEvent) error { return nil })
	if err != context.Canceled {
		t.Errorf("pump = %v, want context.Canceled", err)
	}
}
