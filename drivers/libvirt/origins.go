package libvirt

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	golibvirt "libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
)

// Origins is the record BuildDomain keeps of where the parts of a domain's XML came from: for
// each part, the domain spec field that produced it. libvirt and QEMU refuse a domain in their
// own terms (an element, a device's alias, a path, a tap, a PCI address); Explain turns such a
// refusal back into the spec's field paths.
//
// A part is named by its location: element names below <domain> joined by '/', a repeated
// element by its key in brackets (a device's user alias, a CPU feature's name, a NUMA cell's
// id) and an attribute after '@':
//
//	os/type@machine                               machine.type
//	vcpu                                          cpu (sockets x cores x threads)
//	cpu/model                                     cpu.model
//	cpu/feature[pdpe1gb]                          cpu.features[1].name
//	numatune/memnode[0]@nodeset                   cpu.numaCells[0].hostNodes
//	devices/disk[ua-disk-data]/target@bus         disks[2].bus
//	devices/interface[ua-net-default]/target@dev  nics[0].tapName
//
// A device is also known by the names libvirt and QEMU give it in their messages: its user
// alias (QEMU's device id), guest target (vda), source path, tap, MAC and PCI address; the
// record maps each to the device's part it names.
type Origins struct {
	parts map[string]origin
	names map[string][]string
}

// origin is where one part of the XML came from.
type origin struct {
	field string // the spec's field path
	value string // what the builder wrote there ("" for an element that is only there)
	what  string // for a device: what the spec calls it (disk "data"), for the message
	seq   int    // the order it was recorded in
}

func newOrigins() *Origins {
	return &Origins{parts: map[string]origin{}, names: map[string][]string{}}
}

// add records that the part at loc, holding value, came from field.
func (o *Origins) add(loc, field, value string) {
	o.parts[loc] = origin{field: field, value: value, seq: len(o.parts)}
}

// device records a device of the spec (what: `disk "data"`) at loc, and the names by which
// messages may name it.
func (o *Origins) device(loc, field, what string, names ...string) {
	o.parts[loc] = origin{field: field, what: what, seq: len(o.parts)}
	for _, n := range names {
		o.name(n, loc)
	}
}

// name records that a message naming n is about the part at loc.
func (o *Origins) name(n, loc string) {
	if n != "" && !slices.Contains(o.names[n], loc) {
		o.names[n] = append(o.names[n], loc)
	}
}

// field is the spec field of the part at loc: its own when recorded, else that of the nearest
// recorded part that holds it (an attribute of a disk not recorded is the disk's). It also
// returns what the device holding loc is, when loc is in a device.
func (o *Origins) field(loc string) (field, what string) {
	for l := loc; l != ""; l = parent(l) {
		if p, ok := o.parts[l]; ok && field == "" {
			field = p.field
		}
		if p, ok := o.parts[l]; ok && p.what != "" {
			return field, p.what
		}
	}
	return field, ""
}

// parent is loc without its last attribute or element ("" at the top).
func parent(loc string) string {
	depth := 0
	for i := len(loc) - 1; i >= 0; i-- {
		switch c := loc[i]; {
		case c == ']':
			depth++
		case c == '[':
			depth--
		case depth == 0 && (c == '@' || c == '/'):
			return loc[:i]
		}
	}
	return ""
}

// matching are the recorded locations that match pattern, a location whose bracketed keys may
// be "*" (any), and whose value keep accepts (nil: any), in the order they were recorded.
func (o *Origins) matching(pattern string, keep func(loc string, p origin) bool) []string {
	re := regexp.MustCompile("^" + strings.ReplaceAll(regexp.QuoteMeta(pattern), `\[\*\]`, `\[[^\]]*\]`) + "$")
	var locs []string
	for l, p := range o.parts {
		if re.MatchString(l) && (keep == nil || keep(l, p)) {
			locs = append(locs, l)
		}
	}
	slices.SortFunc(locs, func(a, b string) int { return o.parts[a].seq - o.parts[b].seq })
	return locs
}

// Refusal is libvirt's refusal of a domain, in the domain spec's terms.
type Refusal struct {
	// Fields are the spec's field paths the refusal is about, most specific first; none when
	// no field can be named (the refusal is about something the driver added, or libvirt's
	// message names nothing the driver can place).
	Fields []string
	// What is the device of the spec the fields belong to (disk "data"), if one.
	What string
	// Code is the gRPC code: InvalidArgument for a spec this node's libvirt and QEMU cannot run
	// as written, FailedPrecondition for one the node's state forbids (a host CPU or NUMA node
	// that is not there, a tap that is gone, an image another process holds), Internal when
	// neither can be told.
	Code codes.Code
	// Message is libvirt's message, whole.
	Message string
}

func (r Refusal) Error() string {
	if len(r.Fields) == 0 {
		return "libvirt refused the domain, naming no field of the domain spec: " + r.Message
	}
	s := strings.Join(r.Fields, ", ") + ": "
	if r.What != "" {
		s += r.What + ": "
	}
	return s + "libvirt: " + r.Message
}

// refusal is a kind of libvirt's or QEMU's refusal that names the part of the domain it is
// about.
type refusal struct {
	re *regexp.Regexp
	// at are the locations msg, which matches re with submatches m, is about.
	at func(o *Origins, msg string, m []string) []string
	// code is the refusal's gRPC code; 0 leaves it to libvirt's error number.
	code codes.Code
}

func fixed(locs ...string) func(*Origins, string, []string) []string {
	return func(*Origins, string, []string) []string { return locs }
}

// refusals are the refusals this driver places, each as libvirt 9.0 and QEMU 7.2 wrote it
// (origins_test.go holds their messages as measured), first match first.
var refusals = []refusal{
	// Domain-wide, at define time.
	{re: regexp.MustCompile(`does not support machine type '([^']*)'`), at: fixed("os/type@machine")},
	{re: regexp.MustCompile(`Maximum CPUs greater than specified machine type limit`), at: fixed("vcpu")},
	{re: regexp.MustCompile(`readonly sata disks are not supported`), at: func(o *Origins, _ string, _ []string) []string {
		return o.matching("devices/disk[*]/readonly", func(l string, _ origin) bool {
			return o.parts[parent(l)+"/target@bus"].value == "sata"
		})
	}},
	// PCI addresses: invalid ones, and one given twice ("Attempted double use of PCI Address").
	{re: regexp.MustCompile(`PCI [Aa]ddress ([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])`), at: func(o *Origins, _ string, m []string) []string {
		return o.names[strings.ToLower(m[1])]
	}},
	// The CPU, at start.
	{re: regexp.MustCompile(`Unknown CPU model (\S+)`), at: fixed("cpu/model")},
	{re: regexp.MustCompile(`unknown CPU feature: (\S+)`), at: func(_ *Origins, _ string, m []string) []string {
		return []string{"cpu/feature[" + m[1] + "]"}
	}},
	// The node's resources, at start.
	{re: regexp.MustCompile(`NUMA node (\d+) is unavailable`), code: codes.FailedPrecondition, at: func(o *Origins, _ string, m []string) []string {
		return o.matching("numatune/memnode[*]@nodeset", func(_ string, p origin) bool {
			return slices.Contains(strings.Split(p.value, ","), m[1])
		})
	}},
	{re: regexp.MustCompile(`cannot set CPU affinity`), at: fixed("cputune"), code: codes.FailedPrecondition},
	{re: regexp.MustCompile(`target managed='no' but specified dev doesn't exist`), code: codes.FailedPrecondition, at: func(o *Origins, _ string, _ []string) []string {
		return o.matching("devices/interface[*]/target@dev", nil)
	}},
	// QEMU, at start.
	{re: regexp.MustCompile(`invalid kernel header|could not load kernel`), at: fixed("os/kernel")},
	{re: regexp.MustCompile(`phys-bits too low`), at: fixed("memory")},
	{re: regexp.MustCompile(`-device \{`), at: qemuDevice},
	{re: regexp.MustCompile(`-blockdev \{`), at: qemuBlockdev},
}

// nodeState are the words of a refusal that is about the node's state, not the spec: a file
// that cannot be opened, an image another process holds.
var nodeState = regexp.MustCompile(`Permission denied|No such file or directory|Failed to get "[a-z]+" lock|Device or resource busy`)

// qemuProperties are the QEMU device properties the driver sets from a spec field, by the
// device's element, as the location of that field below the device: a refusal that names one is
// about that field.
var qemuProperties = map[string]map[string]string{
	"disk": {
		"logical_block_size": "blockio@logical_block_size", "physical_block_size": "blockio@physical_block_size",
		"num-queues": "driver@queues", "serial": "serial", "bootindex": "boot", "write-cache": "driver@cache",
		"iothread": "driver@iothread", "share-rw": "shareable",
	},
	"interface": {
		"mac": "mac", "host_mtu": "mtu", "acpi-index": "acpi", "bootindex": "boot", "addr": "address",
		"vectors": "driver@queues", "mq": "driver@queues",
	},
}

var propertyWord = regexp.MustCompile(`[a-z][a-z0-9_-]*`)

// qemuArg decodes the JSON argument of QEMU's option opt ("-device") in msg into v, and returns
// what QEMU said of it (after the argument's ": ").
func qemuArg(msg, opt string, v any) (string, bool) {
	i := strings.Index(msg, opt+" {")
	if i < 0 {
		return "", false
	}
	dec := json.NewDecoder(strings.NewReader(msg[i+len(opt)+1:]))
	if dec.Decode(v) != nil {
		return "", false
	}
	rest := msg[i+len(opt)+1+int(dec.InputOffset()):]
	return strings.TrimPrefix(rest, ": "), true
}

// qemuDevice places QEMU's refusal of a -device: the device by its id (the user alias), or
// within it the fields of the properties QEMU's words name.
func qemuDevice(o *Origins, msg string, _ []string) []string {
	var dev struct {
		ID string `json:"id"`
	}
	said, ok := qemuArg(msg, "-device", &dev)
	if !ok {
		return nil
	}
	var locs []string
	for _, loc := range o.names[dev.ID] {
		props := qemuProperties[deviceElement(loc)]
		n := len(locs)
		for _, w := range propertyWord.FindAllString(said, -1) {
			if sub, ok := props[w]; ok && !slices.Contains(locs, loc+"/"+sub) {
				locs = append(locs, loc+"/"+sub)
			}
		}
		if len(locs) == n {
			locs = append(locs, loc)
		}
	}
	return locs
}

// qemuBlockdev places QEMU's refusal of a -blockdev: a protocol node names its file; a format
// node only its format, which places it among the disks of that format.
func qemuBlockdev(o *Origins, msg string, _ []string) []string {
	var node struct {
		Driver   string `json:"driver"`
		Filename string `json:"filename"`
	}
	if _, ok := qemuArg(msg, "-blockdev", &node); !ok {
		return nil
	}
	if node.Filename != "" {
		return o.names[node.Filename]
	}
	return o.matching("devices/disk[*]/driver@type", func(_ string, p origin) bool { return p.value == node.Driver })
}

// deviceElement is the element of the device holding loc ("disk" of devices/disk[x]/...).
func deviceElement(loc string) string {
	s := strings.TrimPrefix(loc, "devices/")
	if i := strings.IndexByte(s, '['); i >= 0 {
		return s[:i]
	}
	return ""
}

// Explain places libvirt's refusal of the domain (its error number and message) with the
// record: first by the refusals this driver knows (refusals), then by any name of a device the
// message holds (its alias, target, path, tap, MAC or PCI address, as a whole word). The fields
// it returns are those of the most specific parts found; none when nothing recorded matches.
//
// The code: what a known refusal says; else InvalidArgument when a field is named (the spec
// cannot be run as written) or libvirt's error number says the configuration is at fault
// (XML, unsupported configuration, invalid argument); FailedPrecondition when QEMU's words
// are about the node's state (nodeState); Internal otherwise.
func (o *Origins) Explain(num golibvirt.ErrorNumber, msg string) Refusal {
	r := Refusal{Message: msg}
	var locs []string
	for _, k := range refusals {
		m := k.re.FindStringSubmatch(msg)
		if m == nil {
			continue
		}
		if locs = k.at(o, msg, m); len(locs) > 0 {
			r.Code = k.code
			break
		}
	}
	if len(locs) == 0 {
		locs = o.namedIn(msg)
	}
	for _, l := range locs {
		f, what := o.field(l)
		if f == "" || slices.Contains(r.Fields, f) {
			continue
		}
		r.Fields = append(r.Fields, f)
		if r.What == "" {
			r.What = what
		} else if what != r.What {
			r.What = "" // fields of several devices: each field names its own
		}
	}
	switch {
	case r.Code != 0 && len(r.Fields) > 0:
	case nodeState.MatchString(msg):
		r.Code = codes.FailedPrecondition
	case len(r.Fields) > 0:
		r.Code = codes.InvalidArgument
	case num == golibvirt.ERR_XML_ERROR || num == golibvirt.ERR_XML_DETAIL || num == golibvirt.ERR_CONFIG_UNSUPPORTED || num == golibvirt.ERR_INVALID_ARG:
		r.Code = codes.InvalidArgument
	default:
		r.Code = codes.Internal
	}
	return r
}

// namedIn are the locations of the recorded names msg holds as whole words (between quotes,
// spaces, brackets or the ends): the longest names first, so that a path is not taken for its
// file's name.
func (o *Origins) namedIn(msg string) []string {
	names := make([]string, 0, len(o.names))
	for n := range o.names {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int {
		if len(a) != len(b) {
			return len(b) - len(a)
		}
		return strings.Compare(a, b)
	})
	var locs []string
	for _, n := range names {
		if wordIn(msg, n) {
			for _, l := range o.names[n] {
				if !slices.Contains(locs, l) {
					locs = append(locs, l)
				}
			}
		}
	}
	return locs
}

// wordIn says whether msg holds w as a word: with no letter, digit or one of "_-./:" either
// side, except a '.' or ':' that ends a sentence or clause (followed by a space or the end).
func wordIn(msg, w string) bool {
	inWord := func(c byte) bool {
		return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("_-./:", c) >= 0
	}
	for i := 0; ; {
		j := strings.Index(msg[i:], w)
		if j < 0 {
			return false
		}
		j += i
		end := j + len(w)
		before := j == 0 || !inWord(msg[j-1])
		after := end == len(msg) || !inWord(msg[end]) ||
			(msg[end] == '.' || msg[end] == ':') && (end+1 == len(msg) || msg[end+1] == ' ')
		if before && after {
			return true
		}
		i = j + 1
	}
}

// The builder's records of the devices it makes (BuildDomainOrigins).

func diskLoc(x *libvirtxml.DomainDisk) string { return "devices/disk[" + x.Alias.Name + "]" }

// diskOrigins records disk f of the spec, made as x: the disk, its names (alias, guest target,
// path) and the parts its fields set.
func (b *builder) diskOrigins(f string, disk *domainv1.Disk, x *libvirtxml.DomainDisk) {
	loc := diskLoc(x)
	b.org.device(loc, f, fmt.Sprintf("disk %q", disk.GetName()), x.Alias.Name, x.Target.Dev)
	b.org.add(loc+"/target@bus", f+".bus", x.Target.Bus)
	b.org.add(loc+"/target@dev", f, x.Target.Dev)
	b.org.add(loc+"/driver@type", f+".format", x.Driver.Type)
	b.org.add(loc+"/source", f+".path", disk.GetPath())
	b.org.name(disk.GetPath(), loc+"/source")
	b.org.add(loc+"@device", f+".device", "")
	for _, a := range []struct {
		set       bool
		loc, name string
	}{
		{disk.GetCache() != "", "driver@cache", "cache"},
		{disk.GetSerial() != "", "serial", "serial"},
		// A cdrom is read-only by its device.
		{disk.GetReadOnly() && disk.GetDevice() != domainv1.DiskDevice_DISK_DEVICE_CDROM, "readonly", "readOnly"},
		{disk.GetIo() != "", "driver@io", "io"},
		{disk.GetQueues() > 0, "driver@queues", "queues"},
		{disk.GetIothread() != "" && !disk.GetDedicatedIothread(), "driver@iothread", "iothread"},
		{disk.GetDedicatedIothread(), "driver@iothread", "dedicatedIothread"},
		{disk.GetLogicalBlockSize() > 0, "blockio@logical_block_size", "logicalBlockSize"},
		{disk.GetPhysicalBlockSize() > 0, "blockio@physical_block_size", "physicalBlockSize"},
		{disk.GetShareable(), "shareable", "shareable"},
		{disk.GetErrorPolicy() != "", "driver@error_policy", "errorPolicy"},
	} {
		if a.set {
			b.org.add(loc+"/"+a.loc, f+"."+a.name, "")
		}
	}
}

// nicOrigins records NIC f of the spec, made as x: the interface, its names (alias, tap, MAC,
// PCI address) and the parts its fields set.
func (b *builder) nicOrigins(f string, n *domainv1.NIC, x *libvirtxml.DomainInterface) {
	loc := "devices/interface[" + x.Alias.Name + "]"
	b.org.device(loc, f, fmt.Sprintf("interface %q", n.GetName()), x.Alias.Name, n.GetTapName(), strings.ToLower(n.GetMac()))
	b.org.add(loc+"/target@dev", f+".tapName", n.GetTapName())
	b.org.add(loc+"/mac", f+".mac", n.GetMac())
	b.org.add(loc+"/model", f+".model", x.Model.Type)
	for _, a := range []struct {
		set       bool
		loc, name string
	}{
		{n.GetMtu() > 0, "mtu", "mtu"},
		{x.Driver != nil, "driver@queues", "queues"},
		{x.Boot != nil, "boot", "bootOrder"},
		{x.Link != nil, "link", "linkDown"},
		{x.ACPI != nil, "acpi", "acpiIndex"},
	} {
		if a.set {
			b.org.add(loc+"/"+a.loc, f+"."+a.name, "")
		}
	}
	if x.Address != nil {
		b.org.add(loc+"/address", f+".pciAddress", strings.ToLower(n.GetPciAddress()))
		b.org.name(strings.ToLower(n.GetPciAddress()), loc+"/address")
	}
}

// hostDeviceOrigins records the spec's host devices (made by hostDevices, each with the user
// alias ua-hostdev-<name>): the device, its alias and its PCI address.
func (b *builder) hostDeviceOrigins() {
	for i, h := range b.spec.GetHostDevices() {
		f := fmt.Sprintf("hostDevices[%d]", i)
		a := "ua-hostdev-" + alias(h.GetName())
		loc := "devices/hostdev[" + a + "]"
		b.org.device(loc, f, fmt.Sprintf("host device %q", h.GetName()), a)
		pci := strings.ToLower(h.GetPciAddress())
		b.org.add(loc+"/source/address", f+".pciAddress", pci)
		b.org.name(pci, loc+"/source/address")
	}
}
