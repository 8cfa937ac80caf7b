// Package process serves envd's process.Process Connect service: it starts
// commands in the sandbox, streams their output, and lets callers list,
// attach to, feed and signal them.
//
// Every command runs as the agent's own user, the image's user: E2B's SDK
// names a user in an `Authorization: Basic user:` header, but an agent that
// is not root cannot become another user, and one that is must not let a
// caller pick who it runs as, so the header is ignored.
package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"

	pb "github.com/deerflow-sandbox/provisioner/pkg/envd/gen/process"
	"github.com/deerflow-sandbox/provisioner/pkg/envd/gen/process/processconnect"
)

// Service implements processconnect.ProcessHandler.
type Service struct {
	log *slog.Logger

	mu    sync.Mutex
	procs map[uint32]*proc
}

var _ processconnect.ProcessHandler = (*Service)(nil)

// New is a process service.
func New(log *slog.Logger) *Service {
	return &Service{log: log, procs: map[uint32]*proc{}}
}

// Start starts a process and streams its events: start (the pid), data
// (stdout and stderr as they come), end (exit code and status), and
// keepalives while idle if the caller asked for them. The process outlives
// the stream (a caller may disconnect and Connect again), except that a
// request deadline (the SDK's timeoutMs) is the process's too: when it
// passes, the process is killed, as E2B's envd does.
func (s *Service) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	cfg := req.Msg.GetProcess()
	if cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("the process has no cmd"))
	}
	cwd := workingDir(cfg.GetCwd())
	if fi, err := os.Stat(cwd); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return connect.NewError(connect.CodeNotFound, fmt.Errorf("the working directory %q does not exist", cwd))
		}
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("the working directory %q: %w", cwd, err))
	} else if !fi.IsDir() {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("the working directory %q is not a directory", cwd))
	}
	if tag := req.Msg.Tag; tag != nil {
		if _, err := s.find(&pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: *tag}}); err == nil {
			return connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("a running process already has the tag %q", *tag))
		}
	}

	p, err := start(cfg, cwd, req.Msg.GetStdin(), req.Msg.Pty)
	if err != nil {
		return err
	}
	p.info.Tag = req.Msg.Tag
	// Subscribed before any output is read, so the stream misses nothing.
	sub, _ := p.subscribe()
	s.mu.Lock()
	s.procs[p.pid] = p
	s.mu.Unlock()
	s.log.Info("process started", "pid", p.pid, "cmd", cfg.GetCmd(), "args", len(cfg.GetArgs()), "stdin", req.Msg.GetStdin(), "pty", p.tty != nil)
	if d, ok := ctx.Deadline(); ok {
		t := time.AfterFunc(time.Until(d), func() {
			if p.signal(syscall.SIGKILL) == nil {
				s.log.Info("process killed at its request's deadline", "pid", p.pid)
			}
		})
		go func() { <-p.ended; t.Stop() }()
	}
	go func() {
		p.run()
		s.mu.Lock()
		delete(s.procs, p.pid)
		s.mu.Unlock()
		s.log.Info("process ended", "pid", p.pid, "status", p.endEvent().GetStatus())
	}()
	return pump(ctx, p, sub, keepaliveInterval(req.Header()), startHold, func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.StartResponse{Event: ev})
	})
}

// Connect attaches to a running process: a start event with its pid, then
// its further events, as Start streams them.
func (s *Service) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	sub, end := p.subscribe()
	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.ConnectResponse{Event: ev}) }
	if end != nil {
		// It ended between the lookup and now: its start and end are all
		// that is left to tell.
		if err := send(startEvent(p.pid)); err != nil {
			return err
		}
		return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}})
	}
	// No hold: an attached caller waits on a process already running.
	return pump(ctx, p, sub, keepaliveInterval(req.Header()), 0, send)
}

// List answers the running processes, by pid.
func (s *Service) List(context.Context, *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	s.mu.Lock()
	out := make([]*pb.ProcessInfo, 0, len(s.procs))
	for _, p := range s.procs {
		out = append(out, p.info)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Pid < out[j].Pid })
	return connect.NewResponse(&pb.ListResponse{Processes: out}), nil
}

// SendInput writes to a process's stdin.
func (s *Service) SendInput(_ context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.input(req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

// StreamInput writes a client stream's data to a process's stdin: a start
// event naming the process, then data events.
func (s *Service) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			if p != nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("a second start event on the input stream"))
			}
			var err error
			if p, err = s.find(ev.Start.GetProcess()); err != nil {
				return nil, err
			}
		case *pb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("input before the start event that names the process"))
			}
			if err := p.input(ev.Data.GetInput()); err != nil {
				return nil, err
			}
		case *pb.StreamInputRequest_Keepalive:
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

// SendSignal sends SIGTERM or SIGKILL to a process and its process group.
func (s *Service) SendSignal(_ context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case pb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %v: only SIGTERM and SIGKILL are sent", req.Msg.GetSignal()))
	}
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.signal(sig); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d has ended", p.pid))
		}
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("signalling process %d: %w", p.pid, err))
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

// CloseStdin closes a process's stdin: it reads EOF.
func (s *Service) CloseStdin(_ context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.closeStdin(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

// Update resizes a process's pseudo-terminal (sandbox.pty.resize).
func (s *Service) Update(_ context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if req.Msg.Pty == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("the update names no terminal size (pty.size)"))
	}
	if err := p.resize(req.Msg.Pty.GetSize()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}

// find resolves a selector (a pid or a tag) to a running process.
func (s *Service) find(sel *pb.ProcessSelector) (*proc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch v := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		if p, ok := s.procs[v.Pid]; ok {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no running process has pid %d", v.Pid))
	case *pb.ProcessSelector_Tag:
		for _, p := range s.procs {
			if p.info.GetTag() == v.Tag && p.info.Tag != nil {
				return p, nil
			}
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no running process has the tag %q", v.Tag))
	}
	return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("the process selector names neither a pid nor a tag"))
}

// start starts cfg's command in its own process group, with stdout and
// stderr on pipes the agent reads, and stdin on a pipe if asked for (else
// /dev/null); or, with term (sandbox.pty), on a pseudo-terminal of that
// size, in a session of its own whose controlling terminal it is.
func start(cfg *pb.ProcessConfig, cwd string, stdin bool, term *pb.PTY) (*proc, error) {
	cmd := exec.Command(cfg.GetCmd(), cfg.GetArgs()...)
	cmd.Dir = cwd
	// The agent's environment (the container's), then the request's: the
	// later of two values of one name wins.
	cmd.Env = os.Environ()
	keys := make([]string, 0, len(cfg.GetEnvs()))
	for k := range cfg.GetEnvs() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		cmd.Env = append(cmd.Env, k+"="+cfg.GetEnvs()[k])
	}
	if term != nil {
		return startTerminal(cmd, cfg, term)
	}
	// Its own group, so a signal reaches what the command started too
	// (bash -c 'a | b', a background job).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("making the stdout pipe: %w", err))
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("making the stderr pipe: %w", err))
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	var in io.WriteCloser
	if stdin {
		if in, err = cmd.StdinPipe(); err != nil {
			for _, f := range []*os.File{outR, outW, errR, errW} {
				f.Close()
			}
			return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("making the stdin pipe: %w", err))
		}
	}
	err = cmd.Start()
	// The child has its own copies of the write ends; the agent's must go,
	// or the readers would never see EOF.
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return nil, startError(cfg.GetCmd(), err)
	}
	return newProc(cmd, cfg, outR, errR, nil, in), nil
}

// startTerminal starts cmd on a new pseudo-terminal of term's size. The
// new session makes the process its group's leader too, so a signal to
// the group reaches what it started, as without a terminal.
func startTerminal(cmd *exec.Cmd, cfg *pb.ProcessConfig, term *pb.PTY) (*proc, error) {
	ws, err := winsize(term.GetSize())
	if err != nil {
		return nil, err
	}
	tty, err := pty.StartWithAttrs(cmd, ws, &syscall.SysProcAttr{Setsid: true, Setctty: true})
	if err != nil {
		if cmd.Process == nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, exec.ErrNotFound) && !errors.Is(err, fs.ErrPermission) {
			return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("opening a pseudo-terminal: %w", err))
		}
		return nil, startError(cfg.GetCmd(), err)
	}
	return newProc(cmd, cfg, nil, nil, tty, nil), nil
}

func newProc(cmd *exec.Cmd, cfg *pb.ProcessConfig, stdout, stderr, tty *os.File, stdin io.WriteCloser) *proc {
	pid := uint32(cmd.Process.Pid)
	return &proc{
		pid:    pid,
		info:   &pb.ProcessInfo{Pid: pid, Config: cfg},
		cmd:    cmd,
		stdout: stdout,
		stderr: stderr,
		tty:    tty,
		stdin:  stdin,
		subs:   map[*subscriber]struct{}{},
		ended:  make(chan struct{}),
	}
}

// startError explains a command that could not start. The SDK runs every
// command as /bin/bash -l -c COMMAND, so a missing /bin/bash is the usual
// cause and is named as such.
func startError(name string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, exec.ErrNotFound):
		msg := fmt.Sprintf("cannot run %s: it does not exist in this sandbox", name)
		if filepath.Base(name) == "bash" {
			msg += " (the e2b SDK runs every command as /bin/bash -l -c COMMAND, so the template's image needs /bin/bash)"
		}
		return connect.NewError(connect.CodeFailedPrecondition, errors.New(msg))
	case errors.Is(err, fs.ErrPermission):
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("cannot run %s: %w", name, err))
	}
	return connect.NewError(connect.CodeInternal, fmt.Errorf("starting %s: %w", name, err))
}

// workingDir is where a process starts: cwd made absolute, a relative one
// (or "~/...") under the home directory, and the home directory if cwd is
// empty, as E2B's envd does. (pkg/envd/filesystem resolves its paths the
// same way; it is not imported, so this package stays below it.)
func workingDir(cwd string) string {
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		home = "/"
	}
	switch {
	case cwd == "" || cwd == "~":
		return home
	case strings.HasPrefix(cwd, "~/"):
		return filepath.Join(home, cwd[2:])
	case !filepath.IsAbs(cwd):
		return filepath.Join(home, cwd)
	}
	return filepath.Clean(cwd)
}

// keepaliveHeader is the request header in which the e2b SDK asks for a
// keepalive event every so many seconds on a server stream, so that
// proxies and its own idle timers see traffic while a process is quiet.
const keepaliveHeader = "Keepalive-Ping-Interval"

// keepaliveInterval reads keepaliveHeader: 0 (no keepalives) if absent or
// not a positive number of seconds.
func keepaliveInterval(h interface{ Get(string) string }) time.Duration {
	n, err := strconv.Atoi(h.Get(keepaliveHeader))
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}
