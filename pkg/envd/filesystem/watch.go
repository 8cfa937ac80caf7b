package filesystem

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"
	"github.com/google/uuid"

	pb "github.com/deerflow-sandbox/provisioner/pkg/envd/gen/filesystem"
)

const (
	// KeepaliveHeader is the request header in which the e2b SDK asks for a
	// keepalive message every so many seconds on a server stream, so that
	// proxies and its own idle timers see traffic while nothing happens.
	KeepaliveHeader = "Keepalive-Ping-Interval"
	// maxWatchers bounds CreateWatcher's watchers (each holds inotify
	// watches and a buffer) so a caller cannot exhaust them.
	maxWatchers = 128
	// maxBufferedEvents bounds the events a CreateWatcher watcher keeps
	// until GetWatcherEvents collects them; older ones are dropped first.
	maxBufferedEvents = 10_000
)

// KeepaliveInterval reads KeepaliveHeader: 0 (no keepalives) if absent or
// not a positive number of seconds.
func KeepaliveInterval(h interface{ Get(string) string }) time.Duration {
	n, err := strconv.Atoi(h.Get(KeepaliveHeader))
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}

// watch delivers the filesystem events under root to emit until ctx ends.
// It returns once the watch is set up (or failed to be), then runs in the
// background; done is closed when it stops.
func watch(ctx context.Context, root string, recursive, includeEntry bool, emit func(*pb.FilesystemEvent)) (done <-chan struct{}, err error) {
	fi, err := os.Stat(root)
	if err != nil {
		return nil, Error("watching", root, err)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("watching %q: not a directory", root))
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("watching %q: %w", root, err))
	}
	add := func(dir string) error {
		if !recursive {
			return fw.Add(dir)
		}
		return filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					return nil
				}
				return err
			}
			if d.IsDir() {
				return fw.Add(p)
			}
			return nil
		})
	}
	if err := add(root); err != nil {
		fw.Close()
		return nil, Error("watching", root, err)
	}
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		defer fw.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-fw.Errors:
				// An inotify overflow: events were lost. The SDK's
				// protocol has no message for that, so the watch goes on.
				if !ok {
					return
				}
			case ev, ok := <-fw.Events:
				if !ok {
					return
				}
				if recursive && ev.Has(fsnotify.Create) {
					if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
						_ = add(ev.Name) // a directory made under a recursive watch is watched too
					}
				}
				for _, e := range events(root, ev, includeEntry) {
					emit(e)
				}
			}
		}
	}()
	return ch, nil
}

// events turns one fsnotify event, whose Op may carry several operations,
// into the SDK's events, one per operation. Names are relative to root.
func events(root string, ev fsnotify.Event, includeEntry bool) []*pb.FilesystemEvent {
	name, err := filepath.Rel(root, ev.Name)
	if err != nil {
		name = ev.Name
	}
	var entry *pb.EntryInfo
	if includeEntry {
		entry, _ = Stat(ev.Name) // absent once removed or renamed away
	}
	var out []*pb.FilesystemEvent
	for _, m := range []struct {
		op fsnotify.Op
		t  pb.EventType
	}{
		{fsnotify.Create, pb.EventType_EVENT_TYPE_CREATE},
		{fsnotify.Write, pb.EventType_EVENT_TYPE_WRITE},
		{fsnotify.Remove, pb.EventType_EVENT_TYPE_REMOVE},
		{fsnotify.Rename, pb.EventType_EVENT_TYPE_RENAME},
		{fsnotify.Chmod, pb.EventType_EVENT_TYPE_CHMOD},
	} {
		if ev.Has(m.op) {
			out = append(out, &pb.FilesystemEvent{Name: name, Type: m.t, Entry: entry})
		}
	}
	return out
}

// WatchDir streams a directory's events: a start event once the watch is
// set up, then the events, with keepalives while idle if asked for.
func (s *Service) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], stream *connect.ServerStream[pb.WatchDirResponse]) error {
	root, err := Resolve(req.Msg.GetPath())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Events wait here for the stream; a client that stops reading blocks
	// the watch, which then loses events to inotify's overflow, not memory.
	evs := make(chan *pb.FilesystemEvent, 256)
	done, err := watch(ctx, root, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(), func(e *pb.FilesystemEvent) {
		select {
		case evs <- e:
		case <-ctx.Done():
		}
	})
	if err != nil {
		return err
	}
	defer func() { cancel(); <-done }()
	if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	var tick <-chan time.Time
	if d := KeepaliveInterval(req.Header()); d > 0 {
		t := time.NewTicker(d)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-done:
			return connect.NewError(connect.CodeInternal, fmt.Errorf("the watch of %q stopped", root))
		case e := <-evs:
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: e}}); err != nil {
				return err
			}
		case <-tick:
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		}
	}
}

// bufferedWatcher keeps a watch's events until GetWatcherEvents takes them.
type bufferedWatcher struct {
	cancel context.CancelFunc
	done   <-chan struct{}

	mu      sync.Mutex
	events  []*pb.FilesystemEvent
	dropped int
}

// CreateWatcher starts a watch whose events GetWatcherEvents collects.
func (s *Service) CreateWatcher(_ context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	root, err := Resolve(req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	n := len(s.watchers)
	s.mu.Unlock()
	if n >= maxWatchers {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%d watchers exist, the most this agent keeps; remove one first", n))
	}
	// The watch outlives this request: it ends with RemoveWatcher or Close.
	ctx, cancel := context.WithCancel(context.Background())
	w := &bufferedWatcher{cancel: cancel}
	done, err := watch(ctx, root, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(), func(e *pb.FilesystemEvent) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if len(w.events) >= maxBufferedEvents {
			w.events = w.events[1:]
			w.dropped++
		}
		w.events = append(w.events, e)
	})
	if err != nil {
		cancel()
		return nil, err
	}
	w.done = done
	id := uuid.NewString()
	s.mu.Lock()
	s.watchers[id] = w
	s.mu.Unlock()
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: id}), nil
}

// GetWatcherEvents takes the events a watcher collected since last asked.
func (s *Service) GetWatcherEvents(_ context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	w, err := s.watcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	evs, dropped := w.events, w.dropped
	w.events, w.dropped = nil, 0
	w.mu.Unlock()
	if dropped > 0 {
		s.log.Warn("a watcher dropped events nobody collected", "watcher", req.Msg.GetWatcherId(), "dropped", dropped)
	}
	return connect.NewResponse(&pb.GetWatcherEventsResponse{Events: evs}), nil
}

// RemoveWatcher stops a watcher.
func (s *Service) RemoveWatcher(_ context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	id := req.Msg.GetWatcherId()
	s.mu.Lock()
	w, ok := s.watchers[id]
	delete(s.watchers, id)
	s.mu.Unlock()
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no watcher %q", id))
	}
	w.cancel()
	<-w.done
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}

func (s *Service) watcher(id string) (*bufferedWatcher, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.watchers[id]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no watcher %q", id))
	}
	return w, nil
}

// Close stops every watcher.
func (s *Service) Close() {
	s.mu.Lock()
	ws := s.watchers
	s.watchers = map[string]*bufferedWatcher{}
	s.mu.Unlock()
	for _, w := range ws {
		w.cancel()
		<-w.done
	}
}
