// Package deviceplugins serves the devices of a node's device drivers (core/driver Device, such
// as drivers/hostdev) to the kubelet as extended resources devices.kubevisor.io/<resource>: one
// kubelet device plugin per resource a loaded device driver declares, listing exactly the
// devices that driver lists (Watch, or List every poll interval), and answering the kubelet's
// Allocate with the driver's Allocate (device nodes, mounts, environment such as
// PCI_RESOURCE_<NAME>).
//
// # Where the device drivers come from
//
// The process loads the device drivers itself, through the plugin host (core/plugin), with the
// handler's configuration: the same drivers.device and driverConfig (StartDrivers), so that the
// kubelet and the handler's pipeline see one configuration of one driver. It does not borrow
// the handler's driver processes: the kubelet's devices then do not depend on the handler being
// up (a handler restart or upgrade leaves the node's capacity alone), and no socket between the
// two containers needs a protocol of its own. The cost is a second process of each device
// driver on the node, which is why a device driver's answers must follow the host's state, not
// its own memory (hostdev's do: every answer reads /dev and sysfs).
//
// Each plugin re-creates its socket and registers again when the kubelet restarts (the kubelet
// deletes every socket in its directory when it starts) or when kubelet.sock is replaced.
//
// # Resources that change
//
// A device driver's resources may follow its configuration (the hostdev driver's permitted
// host devices, which the live configuration changes: HostDevices). Manager.Resync makes the
// plugins follow: a new resource gets a plugin, one no longer declared is retired (an empty
// list to the kubelet, then the plugin goes). The kubelet copes with a plugin going away, with
// one delay: it keeps the resource on the Node at capacity 0 for its endpoint grace period (5
// minutes) before it drops it. Devices it allocated to running pods stay theirs.
package deviceplugins

import (
	"fmt"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Defaults of Config.
const (
	// DefaultPluginDir is where the kubelet looks for device plugin sockets and serves kubelet.sock.
	DefaultPluginDir = pluginapi.DevicePluginPath
	// DefaultHealthPollInterval is how often the plugin socket and kubelet.sock are checked
	// besides the fsnotify events, and how often a driver without Watch is asked to List.
	DefaultHealthPollInterval = 10 * time.Second
	// KubeletSocketName is the kubelet's registration socket inside the plugin directory.
	KubeletSocketName = "kubelet.sock"
	// DefaultAllocateTimeout bounds a device driver's Allocate within the kubelet's.
	DefaultAllocateTimeout = 30 * time.Second
)

// Config says where the kubelet's device plugin directory is and how often to look.
type Config struct {
	// PluginDir is the kubelet's device plugin directory: the plugins' sockets are created in it
	// and the kubelet's registration socket (kubelet.sock) is dialled there. It is root-only on a
	// node, which is what keeps the sockets away from pods. Default DefaultPluginDir.
	PluginDir string `json:"pluginDir,omitempty"`
	// HealthPollInterval is how often the sockets are checked besides the fsnotify events, and
	// how often a device driver that does not offer Watch is asked to List. Default
	// DefaultHealthPollInterval.
	HealthPollInterval metav1.Duration `json:"healthPollInterval,omitzero"`
}

// withDefaults fills the fields left empty.
func (c Config) withDefaults() Config {
	if c.PluginDir == "" {
		c.PluginDir = DefaultPluginDir
	}
	if c.HealthPollInterval.Duration <= 0 {
		c.HealthPollInterval.Duration = DefaultHealthPollInterval
	}
	return c
}

// validate reports the problems of a defaulted configuration.
func (c Config) validate() error {
	if !filepath.IsAbs(c.PluginDir) {
		return fmt.Errorf("pluginDir %q: not an absolute path", c.PluginDir)
	}
	return nil
}
