package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"

	pb "github.com/deerflow-sandbox/provisioner/pkg/envd/gen/process"
)

const (
	// readChunk is the most output one data event carries.
	readChunk = 32 << 10
	// subscriberBuffer is how many events wait for a slow stream before the
	// process's output readers wait for it too (and the process with them,
	// once its pipe fills): back pressure, not unbounded memory.
	subscriberBuffer = 64
	// outputGrace is how long output is still read after the process
	// exited. Its pipes reach EOF at once unless something it started in
	// the background (cmd &) still holds them; that may run for ever, and
	// the command's end must not wait for it.
	outputGrace = time.Second
	// startHold is how long Start holds its start event back for the
	// process's first output or its end. A short command (the SDK's
	// commands.run('true') is /bin/bash -l -c true, a few ms in gVisor)
	// then sends its start, end and the stream's end back to back, instead
	// of a flush and the client's wake-up while the command runs, which
	// compete with it for the sandbox's CPUs: 0.2-0.35 ms less per call,
	// measured (runsc systrap, 2 CPUs, p50 of 400). The pid of a silent
	// command that runs longer (a background server) comes this much
	// later; its output and end never wait.
	startHold = 20 * time.Millisecond
)

// proc is a started process and those following its events.
type proc struct {
	pid    uint32
	info   *pb.ProcessInfo
	cmd    *exec.Cmd
	stdout *os.File
	stderr *os.File
	// tty is the pseudo-terminal's controlling side when the process was
	// started with one (sandbox.pty): its output is read from it, its
	// input written to it, and stdout and stderr are nil.
	tty *os.File

	stdinMu sync.Mutex
	stdin   io.WriteCloser // nil: started without stdin, or closed

	mu    sync.Mutex
	subs  map[*subscriber]struct{}
	end   *pb.ProcessEvent_EndEvent // set once it has ended and been reaped
	ended chan struct{}             // closed once end is set
}

// subscriber is one stream following a process.
type subscriber struct {
	ch   chan *pb.ProcessEvent
	gone chan struct{}
	once sync.Once
}

// subscribe follows the process's further events; if it has ended, there
// are none, and its end event is returned instead.
func (p *proc) subscribe() (*subscriber, *pb.ProcessEvent_EndEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		return nil, p.end
	}
	s := &subscriber{ch: make(chan *pb.ProcessEvent, subscriberBuffer), gone: make(chan struct{})}
	p.subs[s] = struct{}{}
	return s, nil
}

func (p *proc) unsubscribe(s *subscriber) {
	if s == nil {
		return
	}
	// gone first: a broadcast blocked on this subscriber lets go at once.
	s.once.Do(func() { close(s.gone) })
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
}

// broadcast hands ev to every subscriber, waiting for each to take it or
// leave.
func (p *proc) broadcast(ev *pb.ProcessEvent, subs []*subscriber) {
	for _, s := range subs {
		select {
		case s.ch <- ev:
		case <-s.gone:
		}
	}
}

func (p *proc) subscribers() []*subscriber {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		out = append(out, s)
	}
	return out
}

func (p *proc) endEvent() *pb.ProcessEvent_EndEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.end
}

// run reads the process's output until it ends, then reaps it and
// broadcasts its end.
func (p *proc) run() {
	var readers sync.WaitGroup
	read := func(f *os.File, event func([]byte) *pb.ProcessEvent_DataEvent) {
		defer readers.Done()
		buf := make([]byte, readChunk)
		for {
			n, err := f.Read(buf)
			if n > 0 {
				data := append([]byte(nil), buf[:n]...)
				p.broadcast(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: event(data)}}, p.subscribers())
			}
			if err != nil {
				return
			}
		}
	}
	files := []*os.File{p.stdout, p.stderr}
	if p.tty != nil {
		files = []*os.File{p.tty}
		readers.Add(1)
		go read(p.tty, func(b []byte) *pb.ProcessEvent_DataEvent {
			return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Pty{Pty: b}}
		})
	} else {
		readers.Add(2)
		go read(p.stdout, func(b []byte) *pb.ProcessEvent_DataEvent {
			return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stdout{Stdout: b}}
		})
		go read(p.stderr, func(b []byte) *pb.ProcessEvent_DataEvent {
			return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stderr{Stderr: b}}
		})
	}
	// The output files are *os.File, so Wait does not wait for them: it
	// returns when the process exits. A terminal's reader sees EIO once no
	// process holds the terminal any more.
	waitErr := p.cmd.Wait()
	drained := make(chan struct{})
	go func() { readers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(outputGrace):
		now := time.Now()
		for _, f := range files {
			_ = f.SetReadDeadline(now)
		}
		select {
		case <-drained:
		case <-time.After(outputGrace):
			// A file that takes no deadline: closing it ends its read.
			for _, f := range files {
				_ = f.Close()
			}
			<-drained
		}
	}
	for _, f := range files {
		_ = f.Close()
	}

	end := &pb.ProcessEvent_EndEvent{}
	if ps := p.cmd.ProcessState; ps != nil {
		end.Exited = ps.Exited()
		end.ExitCode = int32(ps.ExitCode()) // -1 if a signal ended it
		end.Status = ps.String()            // "exit status 3", "signal: killed"
	}
	if waitErr != nil {
		// The SDK's CommandExitError carries this as its message.
		msg := waitErr.Error()
		end.Error = &msg
	}
	p.mu.Lock()
	p.end = end
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	close(p.ended)
	p.broadcast(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}}, subs)
}

// signal sends sig to the process's group (the process and what it
// started), or to the process alone if the group is gone.
func (p *proc) signal(sig syscall.Signal) error {
	if p.endEvent() != nil {
		// Reaped: its pid may be another process's by now.
		return os.ErrProcessDone
	}
	if err := syscall.Kill(-int(p.pid), sig); err == nil {
		return nil
	}
	return p.cmd.Process.Signal(sig)
}

func (p *proc) input(in *pb.ProcessInput) error {
	switch v := in.GetInput().(type) {
	case *pb.ProcessInput_Stdin:
		p.stdinMu.Lock()
		defer p.stdinMu.Unlock()
		if p.stdin == nil {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no open stdin: it was started without stdin (start it with stdin: true) or its stdin was closed", p.pid))
		}
		return p.write(p.stdin, v.Stdin, "stdin")
	case *pb.ProcessInput_Pty:
		p.stdinMu.Lock()
		defer p.stdinMu.Unlock()
		if p.tty == nil {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no pseudo-terminal: it was started without one (send stdin instead)", p.pid))
		}
		return p.write(p.tty, v.Pty, "terminal")
	}
	return connect.NewError(connect.CodeInvalidArgument, errors.New("the input carries neither stdin nor pty data"))
}

// resize sets the terminal's size (sandbox.pty.resize): the process gets
// SIGWINCH from the kernel.
func (p *proc) resize(size *pb.PTY_Size) error {
	if p.tty == nil {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no pseudo-terminal to resize: it was started without one", p.pid))
	}
	ws, err := winsize(size)
	if err != nil {
		return err
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if err := pty.Setsize(p.tty, ws); err != nil {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("resizing process %d's terminal: %w", p.pid, err))
	}
	return nil
}

// maxTermSide bounds a terminal's columns and rows: more is no screen.
const maxTermSide = 10000

// winsize is a request's terminal size, 1 to maxTermSide columns and rows.
func winsize(size *pb.PTY_Size) (*pty.Winsize, error) {
	c, r := size.GetCols(), size.GetRows()
	if c == 0 || r == 0 || c > maxTermSide || r > maxTermSide {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("a terminal of %d columns and %d rows: each must be 1 to %d", c, r, maxTermSide))
	}
	return &pty.Winsize{Cols: uint16(c), Rows: uint16(r)}, nil
}

// write hands data to the process's input, its stdin or its terminal
// (what): one it no longer reads (a closed pipe, EPIPE; a terminal whose
// side has gone, EIO) is a precondition failed, not the agent's error.
func (p *proc) write(w io.Writer, data []byte, what string) error {
	if _, err := w.Write(data); err != nil {
		if errors.Is(err, os.ErrClosed) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.EIO) {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d no longer reads its %s: %w", p.pid, what, err))
		}
		return connect.NewError(connect.CodeInternal, fmt.Errorf("writing to process %d's %s: %w", p.pid, what, err))
	}
	return nil
}

func (p *proc) closeStdin() error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return nil // never opened, or closed already: EOF either way
	}
	err := p.stdin.Close()
	p.stdin = nil
	if err != nil && !errors.Is(err, os.ErrClosed) {
		return connect.NewError(connect.CodeInternal, fmt.Errorf("closing process %d's stdin: %w", p.pid, err))
	}
	return nil
}

func startEvent(pid uint32) *pb.ProcessEvent {
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: pid}}}
}

// pump sends a start event, then the subscription's events until the end
// event, with a keepalive after every idle interval (0: none). The start
// event waits up to hold (0: not at all) for the first further event, so
// that both leave together (see startHold).
func pump(ctx context.Context, p *proc, sub *subscriber, keepalive, hold time.Duration, send func(*pb.ProcessEvent) error) error {
	defer p.unsubscribe(sub)
	var first *pb.ProcessEvent
	if hold > 0 {
		t := time.NewTimer(hold)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case first = <-sub.ch:
		case <-t.C:
		}
		t.Stop()
	}
	if err := send(startEvent(p.pid)); err != nil {
		return err
	}
	if first != nil {
		if err := send(first); err != nil {
			return err
		}
		if _, ok := first.GetEvent().(*pb.ProcessEvent_End); ok {
			return nil
		}
	}
	var tick <-chan time.Time
	if keepalive > 0 {
		t := time.NewTicker(keepalive)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev := <-sub.ch:
			if err := send(ev); err != nil {
				return err
			}
			if _, ok := ev.GetEvent().(*pb.ProcessEvent_End); ok {
				return nil
			}
		case <-tick:
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		}
	}
}
