package deviceplugins

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// deviceSet is what one plugin advertises. The Plugin serialises every call, so an
// implementation needs no locking of its own.
type deviceSet interface {
	// scan reads the devices and their health from the host. A device that was listed once
	// stays listed (Unhealthy) when it goes away, so that the kubelet stops handing it out.
	scan() []*pluginapi.Device
	// allocate describes one container's access to ids, all of which the last scan listed.
	allocate(ids []string) *pluginapi.ContainerAllocateResponse
	// watchDirs are the directories whose changes may change health; they need not exist.
	watchDirs() []string
}

var errNoKubelet = errors.New("no kubelet socket")

// preferrer is a deviceSet with an opinion on which free devices go together.
type preferrer interface {
	// preferred picks size IDs from available, including mustInclude.
	preferred(available, mustInclude []string, size int) []string
}

// Registration timing. The kubelet dials the plugin back inside Register, so a registration
// takes as long as that dial; retries back off so a node without a kubelet is not hammered.
const (
	registerTimeout   = 10 * time.Second
	registerRetryMin  = 250 * time.Millisecond
	registerRetryMax  = 5 * time.Second
	socketPermissions = 0o600
)

// Plugin serves one extended resource to the kubelet: a gRPC DevicePlugin server on a unix
// socket in the plugin directory, registered with the kubelet, re-created and re-registered
// whenever the kubelet restarts (it deletes every socket in the directory when it starts).
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	resource      string
	socket        string
	kubeletSocket string
	poll          time.Duration
	devs          deviceSet
	log           hclog.Logger

	mu      sync.Mutex
	list    []*pluginapi.Device
	changed chan struct{} // closed and replaced whenever list changes
	// registrations counts successful registrations, for tests and logs.
	registrations int
}

func newPlugin(cfg Config, resource string, devs deviceSet, log hclog.Logger) *Plugin {
	return &Plugin{
		resource:      resource,
		socket:        filepath.Join(cfg.PluginDir, socketName(resource)),
		kubeletSocket: filepath.Join(cfg.PluginDir, KubeletSocketName),
		poll:          cfg.HealthPollInterval.Duration,
		devs:          devs,
		log:           log.Named(resource),
		changed:       make(chan struct{}),
	}
}

// socketName derives a socket file name from a resource name; the kubelet takes the name
// relative to its plugin directory, so it must hold no "/".
func socketName(resource string) string {
	var b strings.Builder
	b.WriteString("kubevisor-")
	for _, r := range resource {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '.':
			b.WriteRune(r)
		default:
			b.WriteRune('_')
		}
	}
	b.WriteString(".sock")
	return b.String()
}

// ResourceName is the extended resource the plugin advertises.
func (p *Plugin) ResourceName() string { return p.resource }

// SocketPath is the plugin's unix socket.
func (p *Plugin) SocketPath() string { return p.socket }

// Devices returns the devices last reported to the kubelet.
func (p *Plugin) Devices() []*pluginapi.Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.list)
}

// Registrations counts the plugin's successful registrations with a kubelet.
func (p *Plugin) Registrations() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.registrations
}

// Run serves and registers the plugin until ctx ends, then removes its socket. It returns an
// error only when it cannot start at all; later failures are logged and retried.
func (p *Plugin) Run(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Dir(p.socket), 0o750); err != nil {
		return fmt.Errorf("create plugin directory: %w", err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	defer w.Close()
	p.addWatches(w)
	p.refresh()

	srv, err := p.serve()
	if err != nil {
		return err
	}
	l := &lifecycle{p: p, srv: srv, retry: time.NewTimer(0), needRegister: true, backoff: registerRetryMin}
	defer func() { l.srv.Stop() }()
	defer l.retry.Stop()
	poll := time.NewTicker(p.poll)
	defer poll.Stop()

	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("fsnotify watcher closed")
			}
			l.event(ev)
		case err := <-w.Errors:
			p.log.Warn("fsnotify", "error", err)
		case <-poll.C:
			// The backstop for what inotify cannot see (sysfs; device nodes the kernel
			// itself creates in devtmpfs when a module loads) or missed (a directory created
			// after the watch was set up, a dropped event).
			p.addWatches(w)
			p.refresh()
			if statID(p.socket) == (fileID{}) {
				p.log.Info("plugin socket missing; serving again")
				l.restart()
			} else {
				l.checkKubelet()
			}
		case <-l.retry.C:
			l.register(ctx)
		}
	}
}

// lifecycle is the serving and registration state of one Run; only Run's goroutine uses it.
type lifecycle struct {
	p   *Plugin
	srv *grpc.Server
	// retry fires when a registration is due; backoff is the wait after the next failure.
	retry        *time.Timer
	backoff      time.Duration
	needRegister bool
	// registeredWith identifies the kubelet.sock last registered through: another file there
	// means another kubelet, which knows nothing of this plugin.
	registeredWith fileID
}

// event reacts to a change in the plugin directory or a device directory.
func (l *lifecycle) event(ev fsnotify.Event) {
	p := l.p
	switch {
	case ev.Name == p.socket && ev.Has(fsnotify.Remove|fsnotify.Rename):
		if statID(p.socket) == (fileID{}) {
			p.log.Info("plugin socket removed (kubelet restart?); serving again")
			l.restart()
		}
	case ev.Name == p.kubeletSocket && ev.Has(fsnotify.Remove|fsnotify.Rename):
		// The kubelet registered with is gone. Forgetting it matters when its successor's
		// kubelet.sock reuses the inode within the same clock tick.
		if statID(p.kubeletSocket) != l.registeredWith {
			l.registeredWith = fileID{}
		}
	case ev.Name == p.kubeletSocket && ev.Has(fsnotify.Create):
		if l.needRegister {
			// A kubelet is (re)starting: try now rather than at the end of a backoff.
			l.registerNow()
		}
		l.checkKubelet()
	case filepath.Dir(ev.Name) != filepath.Dir(p.socket):
		p.refresh()
	}
}

// restart brings the socket back after the kubelet deleted it, and registers it again. The
// old server stops first: closing its listener unlinks the path, which must not take the new
// socket with it.
func (l *lifecycle) restart() {
	l.srv.Stop()
	if s, err := l.p.serve(); err != nil {
		l.p.log.Error("serve again", "error", err)
	} else {
		l.srv = s
	}
	l.needRegister = true
	l.registerNow()
}

// checkKubelet asks for a registration when kubelet.sock is not the one registered with.
func (l *lifecycle) checkKubelet() {
	if id := statID(l.p.kubeletSocket); id != (fileID{}) && id != l.registeredWith && !l.needRegister {
		l.p.log.Info("kubelet socket re-created; registering again")
		l.needRegister = true
		l.registerNow()
	}
}

func (l *lifecycle) registerNow() {
	l.backoff = registerRetryMin
	resetTimer(l.retry, 0)
}

// register tries a due registration and schedules the next try when it fails.
func (l *lifecycle) register(ctx context.Context) {
	if !l.needRegister {
		return
	}
	id, err := l.p.register(ctx)
	if err != nil {
		logf := l.p.log.Warn
		if errors.Is(err, errNoKubelet) {
			logf = l.p.log.Debug // the kubelet.sock creation will wake us
		}
		logf("register with kubelet", "error", err, "retry_in", l.backoff)
		resetTimer(l.retry, l.backoff)
		l.backoff = min(2*l.backoff, registerRetryMax)
		return
	}
	l.registeredWith, l.needRegister = id, false
	l.p.log.Info("registered with kubelet", "endpoint", filepath.Base(l.p.socket))
}

func resetTimer(t *time.Timer, d time.Duration) {
	t.Stop()
	t.Reset(d)
}

// fileID identifies one incarnation of a file; the zero value means it does not exist. The
// change time is part of it because a file re-created at once often gets the inode just freed.
type fileID struct {
	dev, ino uint64
	ctime    syscall.Timespec
}

func statID(path string) fileID {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileID{}
	}
	return fileID{dev: st.Dev, ino: st.Ino, ctime: st.Ctim}
}

// addWatches watches the plugin directory (socket deletion, kubelet.sock creation) and the
// device directories; the ones missing now are tried again at the next poll.
func (p *Plugin) addWatches(w *fsnotify.Watcher) {
	dirs := append([]string{filepath.Dir(p.socket)}, p.devs.watchDirs()...)
	for _, d := range dirs {
		if slices.Contains(w.WatchList(), d) {
			continue
		}
		if err := w.Add(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			p.log.Debug("watch", "dir", d, "error", err)
		}
	}
}

// refresh rescans the devices and wakes the ListAndWatch streams when anything changed.
func (p *Plugin) refresh() {
	p.mu.Lock()
	defer p.mu.Unlock()
	list := p.devs.scan()
	if slices.EqualFunc(list, p.list, func(a, b *pluginapi.Device) bool { return proto.Equal(a, b) }) {
		return
	}
	p.log.Info("devices changed", "devices", summarize(list))
	p.list = list
	close(p.changed)
	p.changed = make(chan struct{})
}

// summarize counts devices per health for the log.
func summarize(list []*pluginapi.Device) string {
	healthy := 0
	for _, d := range list {
		if d.Health == pluginapi.Healthy {
			healthy++
		}
	}
	return fmt.Sprintf("%d healthy of %d", healthy, len(list))
}

// serve listens on the plugin socket (replacing a stale one) and serves gRPC on it.
func (p *Plugin) serve() (*grpc.Server, error) {
	if err := os.Remove(p.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket: %w", err)
	}
	ln, err := net.Listen("unix", p.socket)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	// Only the kubelet (root) talks to the socket; the directory is root-only too.
	if err := os.Chmod(p.socket, socketPermissions); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod socket: %w", err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			p.log.Error("grpc serve", "error", err)
		}
	}()
	return srv, nil
}

// register announces the plugin to the kubelet and returns the identity of the kubelet.sock
// it used.
func (p *Plugin) register(ctx context.Context) (fileID, error) {
	id := statID(p.kubeletSocket)
	if id == (fileID{}) {
		return fileID{}, fmt.Errorf("%s: %w", p.kubeletSocket, errNoKubelet)
	}
	conn, err := grpc.NewClient("unix://"+p.kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fileID{}, fmt.Errorf("dial kubelet: %w", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.socket),
		ResourceName: p.resource,
		Options:      p.options(),
	})
	if err != nil {
		return fileID{}, err
	}
	p.mu.Lock()
	p.registrations++
	p.mu.Unlock()
	return id, nil
}

// options: no device needs anything before a container starts; a set with preferences
// (VFIO: keep IOMMU groups together) asks the kubelet to consult them.
func (p *Plugin) options() *pluginapi.DevicePluginOptions {
	_, prefers := p.devs.(preferrer)
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: prefers}
}

// GetPreferredAllocation implements pluginapi.DevicePluginServer for the sets that have
// preferences; the kubelet asks only those, as their options say.
func (p *Plugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	pr, ok := p.devs.(preferrer)
	if !ok {
		return nil, status.Errorf(codes.Unimplemented, "%s: no preferred allocation", p.resource)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{
			DeviceIDs: pr.preferred(cr.AvailableDeviceIDs, cr.MustIncludeDeviceIDs, int(cr.AllocationSize)),
		})
	}
	return resp, nil
}

// GetDevicePluginOptions implements pluginapi.DevicePluginServer.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return p.options(), nil
}

// ListAndWatch sends the device list, then again on every change, until the kubelet goes away
// or the server stops.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		p.mu.Lock()
		list, changed := p.list, p.changed
		p.mu.Unlock()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: list}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

// Allocate implements pluginapi.DevicePluginServer. It refuses IDs it never listed and devices
// that are unhealthy now, naming them, rather than hand a container a device that is not there.
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	health := make(map[string]string, len(p.list))
	for _, d := range p.list {
		health[d.ID] = d.Health
	}
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.ContainerRequests {
		var unknown, unhealthy []string
		for _, id := range cr.DevicesIds {
			switch h, ok := health[id]; {
			case !ok:
				unknown = append(unknown, id)
			case h != pluginapi.Healthy:
				unhealthy = append(unhealthy, id)
			}
		}
		if len(unknown) > 0 {
			return nil, status.Errorf(codes.InvalidArgument, "%s: unknown device IDs: %s", p.resource, strings.Join(unknown, ", "))
		}
		if len(unhealthy) > 0 {
			return nil, status.Errorf(codes.FailedPrecondition, "%s: unhealthy devices: %s", p.resource, strings.Join(unhealthy, ", "))
		}
		resp.ContainerResponses = append(resp.ContainerResponses, p.devs.allocate(cr.DevicesIds))
	}
	return resp, nil
}

// PreStartContainer implements pluginapi.DevicePluginServer; the options do not ask the kubelet
// to call it, so it has nothing to do.
func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
