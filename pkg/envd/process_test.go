package envd

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"

	pb "github.com/deerflow-sandbox/provisioner/pkg/envd/gen/process"
)

func TestStartRunsCommands(t *testing.T) {
	a := newAgent(t)
	if err := os.Mkdir(filepath.Join(a.home, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	type want struct {
		Stdout, Stderr string
		Exited         bool
		ExitCode       int32
		Status         string
		Error          string
	}
	cases := []struct {
		name string
		req  *pb.StartRequest
		want want
	}{
		{
			name: "output and exit code",
			req:  bash("echo hi; echo err >&2; exit 3"),
			want: want{Stdout: "hi\n", Stderr: "err\n", Exited: true, ExitCode: 3, Status: "exit status 3", Error: "exit status 3"},
		},
		{
			name: "success",
			req:  bash("true"),
			want: want{Exited: true, Status: "exit status 0"},
		},
		{
			name: "env and absolute cwd",
			req: &pb.StartRequest{Process: &pb.ProcessConfig{
				Cmd: "/bin/bash", Args: []string{"-l", "-c", `echo "$FOO $BAR"; pwd`},
				Envs: map[string]string{"FOO": "foo", "BAR": "bar baz"}, Cwd: new("/"),
			}},
			want: want{Stdout: "foo bar baz\n/\n", Exited: true, Status: "exit status 0"},
		},
		{
			name: "relative cwd is under home, no cwd is home",
			req: &pb.StartRequest{Process: &pb.ProcessConfig{
				Cmd: "/bin/bash", Args: []string{"-l", "-c", `pwd; cd; pwd`}, Cwd: new("sub"),
			}},
			want: want{Stdout: filepath.Join(a.home, "sub") + "\n" + a.home + "\n", Exited: true, Status: "exit status 0"},
		},
		{
			name: "killed by a signal",
			req:  bash("kill -9 $$"),
			want: want{Exited: false, ExitCode: -1, Status: "signal: killed", Error: "signal: killed"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			stream, err := a.procs.Start(ctxTimeout(t, 20*time.Second), connect.NewRequest(c.req))
			if err != nil {
				t.Fatal(err)
			}
			r, err := collect(t, stream)
			if err != nil {
				t.Fatal(err)
			}
			if r.pid == 0 || r.end == nil {
				t.Fatalf("pid %d, end %v: want a start event with a pid and an end event", r.pid, r.end)
			}
			got := want{r.stdout, r.stderr, r.end.GetExited(), r.end.GetExitCode(), r.end.GetStatus(), r.end.GetError()}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestStartRefuses(t *testing.T) {
	a := newAgent(t)
	cases := []struct {
		name    string
		req     *pb.StartRequest
		code    connect.Code
		message string
	}{
		{"no bash", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/nonexistent/bin/bash", Args: []string{"-l", "-c", "true"}}},
			connect.CodeFailedPrecondition, "needs /bin/bash"},
		{"no such cwd", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", "true"}, Cwd: new("/nonexistent")}},
			connect.CodeNotFound, "/nonexistent"},
		{"no cmd", &pb.StartRequest{Process: &pb.ProcessConfig{}}, connect.CodeInvalidArgument, "no cmd"},
		{"no bash, on a terminal", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/nonexistent/bin/bash"}, Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 80, Rows: 24}}},
			connect.CodeFailedPrecondition, "needs /bin/bash"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			stream, err := a.procs.Start(ctxTimeout(t, 10*time.Second), connect.NewRequest(c.req))
			if err == nil {
				_, err = collect(t, stream)
			}
			if code(err) != c.code || !strings.Contains(err.Error(), c.message) {
				t.Errorf("error %v: want code %v with %q", err, c.code, c.message)
			}
		})
	}
}

// A background process: started, left (the stream disconnects), listed,
// attached to again by tag, killed.
func TestBackgroundProcess(t *testing.T) {
	a := newAgent(t)
	ctx, disconnect := context.WithCancel(context.Background())
	req := bash("echo started; sleep 30")
	req.Tag = new("server")
	stream, err := a.procs.Start(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatalf("no start event: %v", stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	disconnect()
	stream.Close()

	list, err := a.procs.List(ctxTimeout(t, 5*time.Second), connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	type info struct {
		Pid  uint32
		Tag  string
		Cmd  string
		Args []string
	}
	var got []info
	for _, p := range list.Msg.GetProcesses() {
		got = append(got, info{p.GetPid(), p.GetTag(), p.GetConfig().GetCmd(), p.GetConfig().GetArgs()})
	}
	if diff := cmp.Diff([]info{{pid, "server", "/bin/bash", []string{"-l", "-c", "echo started; sleep 30"}}}, got); diff != "" {
		t.Errorf("List (-want +got):\n%s", diff)
	}

	// Another process may not take the tag while it runs.
	dup := bash("true")
	dup.Tag = new("server")
	if s, err := a.procs.Start(ctxTimeout(t, 5*time.Second), connect.NewRequest(dup)); err == nil {
		_, err = collect(t, s)
		if code(err) != connect.CodeAlreadyExists {
			t.Errorf("a second process tagged server: %v, want AlreadyExists", err)
		}
	}

	conn, err := a.procs.Connect(ctxTimeout(t, 10*time.Second), connect.NewRequest(&pb.ConnectRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: "server"}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	// Its start event comes once it follows the process: the kill after
	// it is one it sees.
	if !conn.Receive() || conn.Msg().GetEvent().GetStart().GetPid() != pid {
		t.Fatalf("connect: no start event with pid %d: %v %v", pid, conn.Msg(), conn.Err())
	}
	done := make(chan result, 1)
	go func() {
		r, err := collect(t, conn)
		if err != nil {
			t.Errorf("connect stream: %v", err)
		}
		done <- r
	}()
	if _, err := a.procs.SendSignal(ctxTimeout(t, 5*time.Second), connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}},
		Signal:  pb.Signal_SIGNAL_SIGKILL,
	})); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.end.GetStatus() != "signal: killed" {
			t.Errorf("connect saw the end %v: want signal: killed", r.end)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the killed process's end never came")
	}
	eventually(t, "the killed process to leave the list", func() bool {
		l, err := a.procs.List(context.Background(), connect.NewRequest(&pb.ListRequest{}))
		return err == nil && len(l.Msg.GetProcesses()) == 0
	})
	// Gone: the SDK's kill() answers false on NotFound.
	_, err = a.procs.SendSignal(ctxTimeout(t, 5*time.Second), connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}},
		Signal:  pb.Signal_SIGNAL_SIGKILL,
	}))
	if code(err) != connect.CodeNotFound {
		t.Errorf("signalling an ended process: %v, want NotFound", err)
	}
}

func TestStdin(t *testing.T) {
	a := newAgent(t)
	req := bash("cat; echo done")
	req.Stdin = new(true)
	stream, err := a.procs.Start(ctxTimeout(t, 20*time.Second), connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatalf("no start event: %v", stream.Err())
	}
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: stream.Msg().GetEvent().GetStart().GetPid()}}
	if _, err := a.procs.SendInput(ctxTimeout(t, 5*time.Second), connect.NewRequest(&pb.SendInputRequest{
		Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("hello\n")}},
	})); err != nil {
		t.Fatal(err)
	}
	in := a.procs.StreamInput(ctxTimeout(t, 5*time.Second))
	for _, m := range []*pb.StreamInputRequest{
		{Event: &pb.StreamInputRequest_Start{Start: &pb.StreamInputRequest_StartEvent{Process: sel}}},
		{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("streamed\n")}}}}},
	} {
		if err := in.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.procs.CloseStdin(ctxTimeout(t, 5*time.Second), connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	r, err := collect(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	if r.stdout != "hello\nstreamed\ndone\n" || r.end.GetExitCode() != 0 {
		t.Errorf("stdout %q, end %v: want the input echoed, then done, exit 0", r.stdout, r.end)
	}
}

func TestStdinRefusedWithoutStdin(t *testing.T) {
	a := newAgent(t)
	stream, err := a.procs.Start(ctxTimeout(t, 20*time.Second), connect.NewRequest(bash("sleep 5")))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatalf("no start event: %v", stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	_, err = a.procs.SendInput(ctxTimeout(t, 5*time.Second), connect.NewRequest(&pb.SendInputRequest{
		Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("x")}},
	}))
	if code(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "stdin: true") {
		t.Errorf("SendInput to a process without stdin: %v, want FailedPrecondition naming stdin: true", err)
	}
	if _, err := a.procs.SendSignal(ctxTimeout(t, 5*time.Second), connect.NewRequest(&pb.SendSignalRequest{Process: sel, Signal: pb.Signal_SIGNAL_SIGTERM})); err != nil {
		t.Fatal(err)
	}
	r, err := collect(t, stream)
	if err != nil || r.end.GetStatus() != "signal: terminated" {
		t.Errorf("after SIGTERM: end %v, err %v: want signal: terminated", r.end, err)
	}
}

// The request's deadline (the SDK's timeoutMs) ends the process too; a
// mere disconnect does not (TestBackgroundProcess).
func TestDeadlineKills(t *testing.T) {
	a := newAgent(t)
	marker := filepath.Join(a.home, "survived")
	stream, err := a.procs.Start(ctxTimeout(t, 500*time.Millisecond), connect.NewRequest(bash("sleep 2; touch "+marker)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := collect(t, stream); code(err) != connect.CodeDeadlineExceeded {
		t.Errorf("stream error %v: want DeadlineExceeded", err)
	}
	eventually(t, "the timed-out process to be killed", func() bool {
		l, err := a.procs.List(context.Background(), connect.NewRequest(&pb.ListRequest{}))
		return err == nil && len(l.Msg.GetProcesses()) == 0
	})
	time.Sleep(2 * time.Second)
	if _, err := os.Stat(marker); err == nil {
		t.Error("the timed-out process ran on to its end")
	}
}

func TestKeepalive(t *testing.T) {
	a := newAgent(t)
	req := connect.NewRequest(bash("sleep 1.5"))
	req.Header().Set("Keepalive-Ping-Interval", "1")
	stream, err := a.procs.Start(ctxTimeout(t, 10*time.Second), req)
	if err != nil {
		t.Fatal(err)
	}
	r, err := collect(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	if r.keepalives == 0 {
		t.Error("no keepalive in 1.5 s with Keepalive-Ping-Interval: 1")
	}
}

// A background job holding the command's stdout does not hold back its end.
func TestEndDoesNotWaitForBackgroundJobs(t *testing.T) {
	a := newAgent(t)
	start := time.Now()
	stream, err := a.procs.Start(ctxTimeout(t, 20*time.Second), connect.NewRequest(bash("sleep 10 & echo bg")))
	if err != nil {
		t.Fatal(err)
	}
	r, err := collect(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	if r.stdout != "bg\n" || r.end.GetExitCode() != 0 || time.Since(start) > 5*time.Second {
		t.Errorf("stdout %q, end %v after %v: want bg, exit 0, within the output grace", r.stdout, r.end, time.Since(start))
	}
}
