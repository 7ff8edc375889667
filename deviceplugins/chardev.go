package deviceplugins

import (
	"path/filepath"
	"strconv"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// charDevices advertises one shared character device as Slots kubelet devices, all healthy
// while the device node exists.
type charDevices struct {
	dev     CharDevice
	devRoot string
}

func (c *charDevices) hostPath() string { return filepath.Join(c.devRoot, c.dev.Path) }

func (c *charDevices) scan() []*pluginapi.Device {
	health := pluginapi.Unhealthy
	if exists(c.hostPath()) {
		health = pluginapi.Healthy
	}
	// IDs carry the node's base name so that kubelet logs and checkpoints say what they are.
	base := filepath.Base(c.dev.Path)
	list := make([]*pluginapi.Device, c.dev.Slots)
	for i := range list {
		list[i] = &pluginapi.Device{ID: base + "-" + strconv.Itoa(i), Health: health}
	}
	return list
}

// allocate hands the node once, however many slots the container asked for. The paths are the
// host's, inside and outside the container, whatever devRoot the plugin reads them under.
func (c *charDevices) allocate([]string) *pluginapi.ContainerAllocateResponse {
	return &pluginapi.ContainerAllocateResponse{
		Devices: []*pluginapi.DeviceSpec{{
			HostPath:      c.dev.Path,
			ContainerPath: c.dev.Path,
			Permissions:   c.dev.Permissions,
		}},
	}
}

func (c *charDevices) watchDirs() []string { return []string{filepath.Dir(c.hostPath())} }
