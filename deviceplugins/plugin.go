package deviceplugins

import (
	"context"
	"errors"
	"fmt"
	"maps"
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

	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	devicev1 "github.com/kubevisor/kubevisor/core/driver/device/v1"
)

var errNoKubelet = errors.New("no kubelet socket")

// Registration timing. The kubelet dials the plugin back inside Register, so a registration
// takes as long as that dial; retries back off so a node without a kubelet is not hammered.
// A device driver whose Watch or List fails is asked again with the same backoff.
const (
	registerTimeout   = 10 * time.Second
	registerRetryMin  = 250 * time.Millisecond
	registerRetryMax  = 5 * time.Second
	socketPermissions = 0o600
)

// Plugin serves one extended resource of one device driver to the kubelet: a gRPC DevicePlugin
// server on a unix socket in the plugin directory, registered with the kubelet, re-created and
// re-registered whenever the kubelet restarts (it deletes every socket in the directory when it
// starts). Its devices are the driver's List of the resource, followed with Watch where the
// driver offers it; a device the driver stops listing stays listed Unhealthy, so that the
// kubelet stops handing it out, and while the driver does not answer every device is Unhealthy.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	resource      string // devices.kubevisor.io/<driverResource>
	driverRes     string
	src           Source
	socket        string
	kubeletSocket string
	poll          time.Duration
	log           hclog.Logger

	mu   sync.Mutex
	list []*pluginapi.Device
	// devs are the driver's devices by id, as last listed; order is every id ever listed.
	devs    map[string]*devicev1.HostDevice
	order   []string
	changed chan struct{} // closed and replaced whenever list changes
	// retired is set when the plugin's resource is no longer declared (Manager.Resync): the
	// list is empty from then on, and ListAndWatch ends once it has sent it.
	retired bool
	// registrations counts successful registrations, for tests and logs.
	registrations int
}

// retireTimeout bounds the wait for the kubelet's ListAndWatch streams to take a retired
// plugin's empty list before the server is stopped anyway.
const retireTimeout = 2 * time.Second

func newPlugin(cfg Config, resource, driverRes string, src Source, log hclog.Logger) *Plugin {
	return &Plugin{
		resource:      resource,
		driverRes:     driverRes,
		src:           src,
		socket:        filepath.Join(cfg.PluginDir, socketName(resource)),
		kubeletSocket: filepath.Join(cfg.PluginDir, KubeletSocketName),
		poll:          cfg.HealthPollInterval.Duration,
		log:           log.Named(resource),
		devs:          map[string]*devicev1.HostDevice{},
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
	// The first list before the first registration, so that the kubelet's first
	// ListAndWatch has the devices; a driver that fails here is asked again by follow.
	p.listOnce(ctx)
	followCtx, stopFollow := context.WithCancel(ctx)
	followed := make(chan struct{})
	defer func() { stopFollow(); <-followed }()
	go func() { defer close(followed); p.follow(followCtx) }()

	srv, err := p.serve()
	if err != nil {
		return err
	}
	l := &lifecycle{p: p, srv: srv, retry: time.NewTimer(0), needRegister: true, backoff: registerRetryMin}
	defer func() {
		if p.isRetired() {
			// Let the streams send the empty list and end (ListAndWatch returns then).
			stopGracefully(l.srv, retireTimeout)
			p.log.Info("device plugin retired: the driver no longer declares the resource")
			return
		}
		l.srv.Stop()
	}()
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
			// The backstop for what inotify missed (the directory created after the watch
			// was set up, a dropped event).
			p.addWatches(w)
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

// addWatches watches the plugin directory (socket deletion, kubelet.sock creation); when it is
// missing now it is tried again at the next poll.
func (p *Plugin) addWatches(w *fsnotify.Watcher) {
	d := filepath.Dir(p.socket)
	if slices.Contains(w.WatchList(), d) {
		return
	}
	if err := w.Add(d); err != nil && !errors.Is(err, os.ErrNotExist) {
		p.log.Debug("watch", "dir", d, "error", err)
	}
}

// listOnce asks the driver for the resource's devices once.
func (p *Plugin) listOnce(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	devs, err := p.src.Device.List(ctx, p.driverRes)
	if err != nil {
		p.log.Warn("device driver: list", "driver", p.src.Name, "error", err)
		return
	}
	p.update(devs)
}

// follow keeps the device list up to date until ctx ends: through the driver's Watch when it
// declares FEATURE_DEVICE_WATCH, else by List every poll interval. When the driver fails
// (a crashed plugin answers Unavailable until the host restarted it) every device turns
// Unhealthy and the driver is asked again after a backoff.
func (p *Plugin) follow(ctx context.Context) {
	w, watch := driver.Optional[driver.DeviceWatcher](ctx, p.src.Device)
	backoff := registerRetryMin
	for ctx.Err() == nil {
		got := false
		send := func(devs []*devicev1.HostDevice) error {
			got = true
			p.update(devs)
			return nil
		}
		var err error
		if watch {
			err = w.Watch(ctx, p.driverRes, send)
			if err == nil && ctx.Err() == nil {
				err = errors.New("watch ended")
			}
		} else {
			err = p.pollList(ctx, send)
		}
		if ctx.Err() != nil {
			return
		}
		if got {
			backoff = registerRetryMin
		}
		p.log.Warn("device driver", "driver", p.src.Name, "error", err, "retry_in", backoff)
		p.markUnhealthy()
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, registerRetryMax)
	}
}

// pollList sends List every poll interval until ctx ends or List fails.
func (p *Plugin) pollList(ctx context.Context, send func([]*devicev1.HostDevice) error) error {
	t := time.NewTicker(p.poll)
	defer t.Stop()
	for {
		devs, err := p.src.Device.List(ctx, p.driverRes)
		if err != nil {
			return fmt.Errorf("list: %w", err)
		}
		_ = send(devs)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// update takes a list from the driver and wakes the ListAndWatch streams when anything changed.
func (p *Plugin) update(devs []*devicev1.HostDevice) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.devs = map[string]*devicev1.HostDevice{}
	for _, d := range devs {
		if d.GetResource() != p.driverRes || d.GetId() == "" {
			continue // a driver's mistake; List(resource) must answer that resource only
		}
		p.devs[d.GetId()] = d
		if !slices.Contains(p.order, d.GetId()) {
			p.order = append(p.order, d.GetId())
		}
	}
	p.setListLocked()
}

// retire empties the list for good and wakes the ListAndWatch streams, which send it and end:
// the resource is no longer declared. Run then stops serving.
func (p *Plugin) retire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.retired = true
	p.setListLocked()
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Plugin) isRetired() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.retired
}

// stopGracefully stops srv once its calls have ended, or at once after timeout.
func stopGracefully(srv *grpc.Server, timeout time.Duration) {
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		srv.Stop()
		<-done
	}
}

// markUnhealthy reports every device Unhealthy: the driver does not answer.
func (p *Plugin) markUnhealthy() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.devs = map[string]*devicev1.HostDevice{}
	p.setListLocked()
}

// setListLocked makes the kubelet's list from p.devs and p.order (none once retired). p.mu must
// be held.
func (p *Plugin) setListLocked() {
	list := make([]*pluginapi.Device, 0, len(p.order))
	for _, id := range p.order {
		if p.retired {
			break
		}
		dev := &pluginapi.Device{ID: id, Health: pluginapi.Unhealthy}
		if d, ok := p.devs[id]; ok {
			if d.GetHealth() == basev1.Health_HEALTH_HEALTHY {
				dev.Health = pluginapi.Healthy
			}
			if d.GetPciAddress() != "" && d.GetNumaNode() >= 0 {
				dev.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(d.GetNumaNode())}}}
			}
		}
		list = append(list, dev)
	}
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

// options: no device needs anything before a container starts; every resource offers a
// preferred allocation, which keeps the devices of a group (core/driver DeviceGroupAttribute,
// an IOMMU group) together and is the kubelet's own order otherwise.
func (p *Plugin) options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}
}

// GetPreferredAllocation implements pluginapi.DevicePluginServer.
func (p *Plugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{
			DeviceIDs: p.preferredLocked(cr.AvailableDeviceIDs, cr.MustIncludeDeviceIDs, int(cr.AllocationSize)),
		})
	}
	return resp, nil
}

// groupLocked is a device's group: its DeviceGroupAttribute, or itself alone.
func (p *Plugin) groupLocked(id string) string {
	if g := p.devs[id].GetAttributes()[driver.DeviceGroupAttribute]; g != "" {
		return "group " + g
	}
	return "device " + id
}

// preferredLocked keeps groups together. A container is handed whole group nodes, and VFIO
// lets one process at a time use a group, so a group's functions split across two pods leave
// the second unable to open it. It takes, in order: mustInclude; the free devices of groups
// already touched; groups that are wholly free and still fit, largest first; then whatever is
// left, by id.
func (p *Plugin) preferredLocked(available, mustInclude []string, size int) []string {
	free := slices.Sorted(slices.Values(available))
	var chosen []string
	take := func(id string) {
		if len(chosen) < size && !slices.Contains(chosen, id) {
			chosen = append(chosen, id)
		}
	}
	total := map[string]int{}
	for _, id := range p.order {
		total[p.groupLocked(id)]++
	}
	members := map[string][]string{}
	for _, id := range free {
		g := p.groupLocked(id)
		members[g] = append(members[g], id)
	}
	for _, id := range mustInclude {
		take(id)
	}
	for _, id := range slices.Clone(chosen) {
		for _, m := range members[p.groupLocked(id)] {
			take(m)
		}
	}
	groups := slices.Collect(maps.Keys(members))
	slices.SortFunc(groups, func(a, b string) int {
		if d := len(members[b]) - len(members[a]); d != 0 {
			return d
		}
		return strings.Compare(members[a][0], members[b][0])
	})
	for _, g := range groups {
		if ms := members[g]; len(ms) == total[g] && len(ms) <= size-len(chosen) {
			for _, id := range ms {
				take(id)
			}
		}
	}
	for _, id := range free {
		take(id)
	}
	return chosen
}

// GetDevicePluginOptions implements pluginapi.DevicePluginServer.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return p.options(), nil
}

// ListAndWatch sends the device list, then again on every change, until the kubelet goes away
// or the server stops, or the plugin is retired (after the empty list).
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		p.mu.Lock()
		list, changed, retired := p.list, p.changed, p.retired
		p.mu.Unlock()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: list}); err != nil {
			return err
		}
		if retired {
			return nil
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

// Allocate implements pluginapi.DevicePluginServer. It refuses IDs it never listed and devices
// that are unhealthy now, naming them, then asks the device driver's Allocate for each
// container: its device nodes, mounts and environment are the container's. A driver's error
// keeps its code and names the driver.
func (p *Plugin) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	p.mu.Lock()
	health := make(map[string]string, len(p.list))
	for _, d := range p.list {
		health[d.ID] = d.Health
	}
	p.mu.Unlock()
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
	}
	ctx, cancel := context.WithTimeout(ctx, DefaultAllocateTimeout)
	defer cancel()
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.ContainerRequests {
		dr, err := p.src.Device.Allocate(ctx, &devicev1.AllocateRequest{Resource: p.driverRes, DeviceIds: cr.DevicesIds})
		if err != nil {
			st := status.Convert(err)
			return nil, status.Errorf(st.Code(), "%s: device driver %s: allocate %s: %s", p.resource, p.src.Name, strings.Join(cr.DevicesIds, ", "), st.Message())
		}
		resp.ContainerResponses = append(resp.ContainerResponses, containerResponse(dr))
	}
	return resp, nil
}

// containerResponse is a device driver's Allocate answer as the kubelet takes it.
func containerResponse(dr *devicev1.AllocateResponse) *pluginapi.ContainerAllocateResponse {
	cr := &pluginapi.ContainerAllocateResponse{Envs: dr.GetEnv()}
	for _, n := range dr.GetDeviceNodes() {
		cr.Devices = append(cr.Devices, &pluginapi.DeviceSpec{HostPath: n.GetHostPath(), ContainerPath: n.GetContainerPath(), Permissions: n.GetPermissions()})
	}
	for _, m := range dr.GetMounts() {
		cr.Mounts = append(cr.Mounts, &pluginapi.Mount{HostPath: m.GetHostPath(), ContainerPath: m.GetContainerPath(), ReadOnly: m.GetReadOnly()})
	}
	return cr
}

// PreStartContainer implements pluginapi.DevicePluginServer; the options do not ask the kubelet
// to call it, so it has nothing to do.
func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
