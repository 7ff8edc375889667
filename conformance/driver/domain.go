package conformance

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
)

// GuestDomain returns a domain spec function for WithDomain that boots g, so that the hypervisor
// checks run a VM with something to boot and Console/Output can wait for g.ReadyMarker
// (WithConsoleMarker): g's kernel and initrd when it has them, else its disk, read-only (so that
// every VM may open it at once). The serial console is on a socket in the run directory.
func GuestDomain(g Guest) (func(id, dir string) *domainv1.DomainSpec, error) {
	if err := g.validate(); err != nil {
		return nil, err
	}
	g = g.withDefaults()
	return func(id, dir string) *domainv1.DomainSpec {
		spec := guestDomain(domainPlan{ID: id, RunDir: dir, Guest: g, KernelBoot: g.Kernel != ""}, nil)
		if g.Kernel == "" {
			format := domainv1.DiskFormat_DISK_FORMAT_RAW
			if strings.HasSuffix(g.Disk, ".qcow2") {
				format = domainv1.DiskFormat_DISK_FORMAT_QCOW2
			}
			spec.Disks = []*domainv1.Disk{{Name: "guest", Path: g.Disk, Format: format, ReadOnly: true, BootOrder: 1}}
		}
		return spec
	}, nil
}

// DomainFromFile returns a domain spec function for WithDomain from a file holding a DomainSpec
// as protobuf JSON (camelCase field names, as the API's: {"memory": {"guestBytes": "268435456"},
// "firmware": {"kernel": {"kernelPath": "/boot/vmlinuz"}}, "serial": {}}). Each VM gets a copy
// with its id and run directory; a name when the file has none; and, when the file asks for a
// serial console or VNC without a socket path, a socket in the run directory.
func DomainFromFile(path string) (func(id, dir string) *domainv1.DomainSpec, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("domain spec: %w", err)
	}
	base := &domainv1.DomainSpec{}
	if err := protojson.Unmarshal(raw, base); err != nil {
		return nil, fmt.Errorf("domain spec %s: %w", path, err)
	}
	return func(id, dir string) *domainv1.DomainSpec {
		spec := proto.CloneOf(base)
		spec.Id, spec.RunDir = id, dir
		if spec.GetName() == "" {
			spec.Name = "conformance/" + id
		}
		if s := spec.GetSerial(); s != nil && s.GetSocketPath() == "" {
			s.SocketPath = filepath.Join(dir, serialSocket)
		}
		if v := spec.GetVnc(); v != nil && v.GetSocketPath() == "" {
			v.SocketPath = filepath.Join(dir, "vnc.sock")
		}
		return spec
	}, nil
}
