package liveconfig

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

func TestMergeHostDevices(t *testing.T) {
	gpu := &v1alpha1.PermittedHostDevices{PCIHostDevices: []v1alpha1.PCIHostDevice{{PCIVendorSelector: "10DE:1EB8", ResourceName: "gpu"}}}
	for _, c := range []struct {
		name      string
		base      string
		permitted *v1alpha1.PermittedHostDevices
		want      string
	}{
		{"none: the base as it is", `{"devRoot": "/host"}`, nil, `{"devRoot": "/host"}`},
		{"replaces the base's", `{"devRoot":"/host","permittedHostDevices":{"pciHostDevices":[{"pciVendorSelector":"8086:1572","resourceName":"nic"}]}}`, gpu,
			`{"devRoot":"/host","permittedHostDevices":{"pciHostDevices":[{"pciVendorSelector":"10DE:1EB8","resourceName":"gpu"}]}}`},
		{"empty permits none", `{"devRoot":"/host"}`, &v1alpha1.PermittedHostDevices{}, `{"devRoot":"/host","permittedHostDevices":{}}`},
		{"no base", ``, gpu, `{"permittedHostDevices":{"pciHostDevices":[{"pciVendorSelector":"10DE:1EB8","resourceName":"gpu"}]}}`},
		{"null base", `null`, gpu, `{"permittedHostDevices":{"pciHostDevices":[{"pciVendorSelector":"10DE:1EB8","resourceName":"gpu"}]}}`},
	} {
		got, err := MergeHostDevices(json.RawMessage(c.base), c.permitted)
		if err != nil || string(got) != c.want {
			t.Errorf("%s: %s, %v; want %s", c.name, got, err, c.want)
		}
	}
	if _, err := MergeHostDevices(json.RawMessage(`[1]`), gpu); err == nil || !strings.Contains(err.Error(), "driverConfig.hostdev: not a JSON object") {
		t.Errorf("a base that is not an object: %v", err)
	}
}

// TestHostDevicesApplier: each new value reaches set once (the ConfigMap changing without it
// does not call set again); a driver restarting (Unavailable) is asked again; a refused change
// is logged with the driver's words and tried again at the next version; nil is the node's.
func TestHostDevicesApplier(t *testing.T) {
	defer func(d time.Duration) { hostDevicesRetry = d }(hostDevicesRetry)
	hostDevicesRetry = 2 * time.Second
	var (
		calls   []*v1alpha1.PermittedHostDevices
		answers []error
		logs    []string
	)
	set := func(_ context.Context, p *v1alpha1.PermittedHostDevices) error {
		calls = append(calls, p)
		if len(answers) == 0 {
			return nil
		}
		err := answers[0]
		answers = answers[1:]
		return err
	}
	log := funcr.New(func(prefix, args string) { logs = append(logs, args) }, funcr.Options{})
	apply := HostDevices(context.Background(), set, log)
	with := func(res string) Config {
		c := New()
		if res != "" {
			c.PermittedHostDevices = &v1alpha1.PermittedHostDevices{PCIHostDevices: []v1alpha1.PCIHostDevice{{PCIVendorSelector: "10de:1eb8", ResourceName: res}}}
		}
		return c
	}

	apply(New())
	apply(New()) // another version of the ConfigMap, the same value
	if len(calls) != 1 || calls[0] != nil {
		t.Fatalf("calls %v, want one with nil (the node's)", calls)
	}
	answers = []error{status.Error(codes.Unavailable, "driver \"hostdev\" is not running: restarting")}
	apply(with("gpu"))
	if len(calls) != 3 || calls[2].PCIHostDevices[0].ResourceName != "gpu" {
		t.Fatalf("calls %d, want the Unavailable one asked again", len(calls))
	}
	refused := status.Error(codes.InvalidArgument, `driver "hostdev": config.permittedHostDevices.pciHostDevices[0].resourceName "kvm": already a character device (config.charDevices[0])`)
	answers = []error{refused}
	apply(with("kvm"))
	if len(calls) != 4 {
		t.Fatalf("calls %d: a refusal is not retried at once", len(calls))
	}
	if last := logs[len(logs)-1]; !strings.Contains(last, "permitted host devices refused") || !strings.Contains(last, `config.permittedHostDevices.pciHostDevices[0].resourceName \"kvm\"`) {
		t.Errorf("refusal logged as %s", last)
	}
	apply(with("kvm")) // the next version: tried again
	if len(calls) != 5 {
		t.Errorf("calls %d: the value refused before is asked again at the next version", len(calls))
	}
	apply(New())
	if len(calls) != 6 || calls[5] != nil {
		t.Errorf("the ConfigMap gone: calls %v, want nil last", calls)
	}
	// A driver that stays down is given up on after hostDevicesRetry.
	start := time.Now()
	answers = nil
	for range 100 {
		answers = append(answers, status.Error(codes.Unavailable, "down"))
	}
	apply(with("gpu"))
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("gave up after %v, want about %v", d, hostDevicesRetry)
	}
	if last := logs[len(logs)-1]; !strings.Contains(last, "permitted host devices refused") {
		t.Errorf("giving up logged as %s", last)
	}
}
