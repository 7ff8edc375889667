package webhook

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// probes checks livenessProbe and readinessProbe. A probe has exactly one of httpGet,
// tcpSocket, exec and guestAgentPing. The kubelet runs httpGet and tcpSocket against the
// launcher pod's address, so each needs a guest interface on the pod network that the kubelet
// reaches there: masquerade forwards the pod's ports to the guest (those of interfaces[].ports
// when it lists any), bridge gives the guest the pod's own address; and a numeric port, and no
// host of its own. exec and guestAgentPing go through the guest agent (the node handler asks
// the hypervisor driver, and refuses them when the driver does not declare
// FEATURE_HYPERVISOR_GUEST_EXEC); exec needs a command.
func (v *validator) probes() {
	for _, pr := range []struct {
		name     string
		probe    *v1alpha1.Probe
		liveness bool
	}{{"livenessProbe", v.spec.LivenessProbe, true}, {"readinessProbe", v.spec.ReadinessProbe, false}} {
		if pr.probe != nil {
			v.probe(v.path.Child(pr.name), pr.probe, pr.liveness)
		}
	}
}

func (v *validator) probe(p *field.Path, pr *v1alpha1.Probe, liveness bool) {
	if liveness && pr.SuccessThreshold > 1 {
		v.add(field.Invalid(p.Child("successThreshold"), pr.SuccessThreshold, "must be 1 for a liveness probe"))
	}
	h := pr.ProbeHandler
	var set []string
	for _, m := range []struct {
		name string
		set  bool
	}{{"httpGet", h.HTTPGet != nil}, {"tcpSocket", h.TCPSocket != nil}, {"exec", h.Exec != nil}, {"guestAgentPing", h.GuestAgentPing != nil}} {
		if m.set {
			set = append(set, m.name)
		}
	}
	switch len(set) {
	case 0:
		v.add(field.Required(p, "exactly one of httpGet, tcpSocket, exec and guestAgentPing is required"))
		return
	case 1:
	default:
		v.add(field.Invalid(p, strings.Join(set, ", "), "exactly one of httpGet, tcpSocket, exec and guestAgentPing may be set"))
		return
	}
	var port intstr.IntOrString
	var pp *field.Path
	switch {
	case h.HTTPGet != nil:
		pp = p.Child("httpGet")
		port = h.HTTPGet.Port
		if h.HTTPGet.Host != "" {
			v.add(field.Invalid(pp.Child("host"), h.HTTPGet.Host, "a host is "+notSupported+": the kubelet probes the guest at the launcher pod's address"))
		}
		if s := h.HTTPGet.Scheme; s != "" && s != corev1.URISchemeHTTP && s != corev1.URISchemeHTTPS {
			v.add(field.NotSupported(pp.Child("scheme"), s, []string{string(corev1.URISchemeHTTP), string(corev1.URISchemeHTTPS)}))
		}
	case h.TCPSocket != nil:
		pp = p.Child("tcpSocket")
		port = h.TCPSocket.Port
		if h.TCPSocket.Host != "" {
			v.add(field.Invalid(pp.Child("host"), h.TCPSocket.Host, "a host is "+notSupported+": the kubelet probes the guest at the launcher pod's address"))
		}
	case h.Exec != nil:
		if len(h.Exec.Command) == 0 || h.Exec.Command[0] == "" {
			v.add(field.Required(p.Child("exec", "command"), "the program to run in the guest, and its arguments"))
		}
		return
	default: // guestAgentPing: nothing to check
		return
	}
	portPath := pp.Child("port")
	if port.Type != intstr.Int {
		v.add(field.Invalid(portPath, port.String(), "a named port is "+notSupported+": give the port number the guest serves"))
		return
	}
	if port.IntVal < 1 || port.IntVal > 65535 {
		v.add(field.Invalid(portPath, port.IntVal, "must be between 1 and 65535"))
		return
	}
	if msg := probeReach(v.spec, v.domainPath().Child("devices", "interfaces"), port.IntVal); msg != "" {
		v.add(field.Invalid(portPath, port.IntVal, msg))
	}
}

// probeReach says why the kubelet's probe of the launcher pod's address on port would not
// reach the guest, "" when it would: the guest's pod-network interface is masquerade (forwarding
// port, or every port when it lists none) or bridge.
func probeReach(spec *v1alpha1.VirtualMachineInstanceSpec, interfaces *field.Path, port int32) string {
	pod := ""
	for _, n := range spec.Networks {
		if n.Pod != nil {
			pod = n.Name
		}
	}
	for i, iface := range spec.Domain.Devices.Interfaces {
		if iface.Name != pod || pod == "" {
			continue
		}
		switch {
		case iface.Bridge != nil:
			return "" // the guest holds the pod's address
		case iface.Masquerade != nil:
			if len(iface.Ports) == 0 || slices.ContainsFunc(iface.Ports, func(fp v1alpha1.Port) bool {
				return fp.Port == port && (fp.Protocol == "" || strings.EqualFold(fp.Protocol, "TCP"))
			}) {
				return ""
			}
			return fmt.Sprintf("the probe does not reach the guest: %s does not forward TCP port %d", interfaces.Index(i).Child("ports"), port)
		}
	}
	return "the probe does not reach the guest: it needs an interface on the pod network (masquerade or bridge), which the kubelet reaches at the launcher pod's address"
}
