package envd

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/deerflow-sandbox/provisioner/pkg/envd/gen/process"
)

// terminal follows a pty process's stream: its output, as the SDK's
// onData gets it, and its end.
type terminal struct {
	pid  uint32
	mu   sync.Mutex
	out  strings.Builder
	end  *pb.ProcessEvent_EndEvent
	done chan struct{}
}

func (tm *terminal) output() string {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.out.String()
}

// follow reads s (a Start or Connect stream) in the background; its first
// event, the start, is read here.
func follow[T interface{ GetEvent() *pb.ProcessEvent }](t *testing.T, s interface {
	eventStream
	Msg() T
}) *terminal {
	t.Helper()
	tm := &terminal{done: make(chan struct{})}
	if !s.Receive() {
		t.Fatalf("no start event: %v", s.Err())
	}
	if start := s.Msg().GetEvent().GetStart(); start != nil {
		tm.pid = start.GetPid()
	}
	go func() {
		defer close(tm.done)
		for s.Receive() {
			switch e := s.Msg().GetEvent().GetEvent().(type) {
			case *pb.ProcessEvent_Data:
				if e.Data.GetStdout() != nil || e.Data.GetStderr() != nil {
					t.Errorf("a pty process sent stdout or stderr: %v", e.Data)
				}
				tm.mu.Lock()
				tm.out.Write(e.Data.GetPty())
				tm.mu.Unlock()
			case *pb.ProcessEvent_End:
				tm.mu.Lock()
				tm.end = e.End
				tm.mu.Unlock()
			}
		}
	}()
	return tm
}

func (a *agent) typeIn(t *testing.T, pid uint32, s string) {
	t.Helper()
	_, err := a.procs.SendInput(ctxTimeout(t, 5*time.Second), connect.NewRequest(&pb.SendInputRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}},
		Input:   &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte(s)}}}))
	if err != nil {
		t.Fatalf("input %q: %v", s, err)
	}
}

// ptyRequest is what the SDK's pty.create sends: an interactive login
// bash on a terminal of that size, with TERM and the locale set.
func ptyRequest(cols, rows uint32, envs map[string]string) *pb.StartRequest {
	e := map[string]string{"TERM": "xterm-256color", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
	for k, v := range envs {
		e[k] = v
	}
	return &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"}, Envs: e},
		Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: cols, Rows: rows}}}
}

// TestPTY: a process on a pseudo-terminal (sandbox.pty) gets its size,
// env and typed input, streams its output as pty data, is resized, and
// is reattached to after a disconnect, its output going on to the new
// stream; its end is its exit code.
func TestPTY(t *testing.T) {
	a := newAgent(t)
	ctx, disconnect := context.WithCancel(context.Background())
	defer disconnect()
	stream, err := a.procs.Start(ctx, connect.NewRequest(ptyRequest(80, 24, map[string]string{"ABC": "123"})))
	if err != nil {
		t.Fatal(err)
	}
	first := follow(t, stream)
	a.typeIn(t, first.pid, "echo \"abc=$ABC\"; stty size\n")
	eventually(t, "the env and the size on the terminal", func() bool {
		o := first.output()
		return strings.Contains(o, "abc=123") && strings.Contains(o, "24 80")
	})
	_, err = a.procs.Update(ctxTimeout(t, 5*time.Second), connect.NewRequest(&pb.UpdateRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: first.pid}},
		Pty:     &pb.PTY{Size: &pb.PTY_Size{Cols: 100, Rows: 30}}}))
	if err != nil {
		t.Fatalf("resize: %v", err)
	}
	a.typeIn(t, first.pid, "stty size\n")
	eventually(t, "the new size", func() bool { return strings.Contains(first.output(), "30 100") })

	// Disconnect, then attach again: the process lives on and its output
	// reaches the new stream.
	disconnect()
	<-first.done
	again, err := a.procs.Connect(ctxTimeout(t, 20*time.Second), connect.NewRequest(&pb.ConnectRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: first.pid}}}))
	if err != nil {
		t.Fatal(err)
	}
	second := follow(t, again)
	if second.pid != first.pid {
		t.Errorf("reattached to pid %d, want %d", second.pid, first.pid)
	}
	a.typeIn(t, first.pid, "echo \"again=$ABC\"; exit 7\n")
	select {
	case <-second.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the terminal's process did not end after exit")
	}
	if !strings.Contains(second.output(), "again=123") {
		t.Errorf("the reattached stream got %q, want the output typed after it", second.output())
	}
	if second.end == nil || second.end.GetExitCode() != 7 {
		t.Errorf("end %v, want exit code 7", second.end)
	}
}

// TestPTYRefuses: a terminal without a usable size, a resize or terminal
// input for a process that has no terminal, and one for no process, each
// answered with the code the SDK reads.
func TestPTYRefuses(t *testing.T) {
	a := newAgent(t)
	plain, err := a.procs.Start(ctxTimeout(t, 20*time.Second), connect.NewRequest(bash("sleep 10")))
	if err != nil {
		t.Fatal(err)
	}
	p := follow(t, plain)
	t.Cleanup(func() {
		_, _ = a.procs.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{
			Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: p.pid}}, Signal: pb.Signal_SIGNAL_SIGKILL}))
	})
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: p.pid}}
	for _, c := range []struct {
		name    string
		call    func() error
		code    connect.Code
		message string
	}{
		{"no columns", func() error {
			s, err := a.procs.Start(ctxTimeout(t, 5*time.Second), connect.NewRequest(ptyRequest(0, 24, nil)))
			if err == nil {
				_, err = collect(t, s)
			}
			return err
		}, connect.CodeInvalidArgument, "0 columns"},
		{"too many rows", func() error {
			s, err := a.procs.Start(ctxTimeout(t, 5*time.Second), connect.NewRequest(ptyRequest(80, 100000, nil)))
			if err == nil {
				_, err = collect(t, s)
			}
			return err
		}, connect.CodeInvalidArgument, "1 to 10000"},
		{"a resize of a process without a terminal", func() error {
			_, err := a.procs.Update(ctxTimeout(t, 5*time.Second), connect.NewRequest(&pb.UpdateRequest{Process: sel, Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 80, Rows: 24}}}))
			return err
		}, connect.CodeFailedPrecondition, "no pseudo-terminal"},
		{"an update without a size", func() error {
			_, err := a.procs.Update(ctxTimeout(t, 5*time.Second), connect.NewRequest(&pb.UpdateRequest{Process: sel}))
			return err
		}, connect.CodeInvalidArgument, "no terminal size"},
		{"terminal input to a process without one", func() error {
			_, err := a.procs.SendInput(ctxTimeout(t, 5*time.Second), connect.NewRequest(&pb.SendInputRequest{Process: sel,
				Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte("x")}}}))
			return err
		}, connect.CodeFailedPrecondition, "no pseudo-terminal"},
		{"a resize of no process", func() error {
			_, err := a.procs.Update(ctxTimeout(t, 5*time.Second), connect.NewRequest(&pb.UpdateRequest{
				Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: 999999}}, Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 80, Rows: 24}}}))
			return err
		}, connect.CodeNotFound, "999999"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			if code(err) != c.code || !strings.Contains(err.Error(), c.message) {
				t.Errorf("error %v: want code %v with %q", err, c.code, c.message)
			}
		})
	}
}

// TestPTYKill: a terminal's process killed by the SDK's pty.kill (SIGKILL)
// ends, its stream with it.
func TestPTYKill(t *testing.T) {
	a := newAgent(t)
	stream, err := a.procs.Start(ctxTimeout(t, 20*time.Second), connect.NewRequest(ptyRequest(80, 24, nil)))
	if err != nil {
		t.Fatal(err)
	}
	tm := follow(t, stream)
	if _, err := a.procs.SendSignal(ctxTimeout(t, 5*time.Second), connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: tm.pid}}, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	select {
	case <-tm.done:
	case <-time.After(10 * time.Second):
		t.Fatal("a killed terminal's stream did not end")
	}
	if tm.end == nil || tm.end.GetStatus() != "signal: killed" {
		t.Errorf("end %v, want signal: killed", tm.end)
	}
}
