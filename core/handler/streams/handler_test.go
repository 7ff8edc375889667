package streams

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/driver"
	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/nodeapi"
	"github.com/kubevisor/kubevisor/core/plugin"
	"github.com/kubevisor/kubevisor/drivers/fake"
	"github.com/kubevisor/kubevisor/internal/testbin"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// TestWithTheNodeHandler: the endpoint over a real node handler running a VMI on the fake
// driver plugins: the console carries bytes both ways, pause shows in the VMI's status, an
// ability the driver does not offer is 501.
func TestWithTheNodeHandler(t *testing.T) {
	testenv.Heavy(t, "driver plugins built with the go command")
	dir, err := os.MkdirTemp("/tmp", "kvs-") // unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	bin := filepath.Join(dir, "bin")
	if err := testbin.Build(bin, false, "github.com/kubevisor/kubevisor/cmd/kubevisor-driver-fake",
		"github.com/kubevisor/kubevisor/core/handler/internal/testdriver"); err != nil {
		t.Fatal(err)
	}
	manifest := func(path, kind, name string, args ...string) plugin.Manifest {
		m, err := plugin.ManifestFor(path, kind, name)
		if err != nil {
			t.Fatal(err)
		}
		m.Args = args
		return m
	}
	fakeBin, testBin := filepath.Join(bin, "kubevisor-driver-fake"), filepath.Join(bin, "testdriver")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h, err := handler.New(ctx, handler.Config{
		StateDir: filepath.Join(dir, "s"), RunDir: filepath.Join(dir, "r"), NodeName: "node-1",
		Drivers: handler.DriverSet{Hypervisor: "fake", Network: "fake-net", Storage: "fake-storage"},
	}, handler.Options{
		Logger: testLogger(t),
		Manifests: []plugin.Manifest{
			manifest(fakeBin, driver.KindHypervisor, "fake", driver.KindHypervisor),
			manifest(testBin, driver.KindNetwork, "fake-net", driver.KindNetwork, "name=fake-net"),
			manifest(testBin, driver.KindStorage, "fake-storage", driver.KindStorage, "name=fake-storage"),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	mem := resource.MustParse("64Mi")
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "default", UID: "uid-real"},
		Spec:       v1alpha1.VirtualMachineInstanceSpec{Domain: v1alpha1.DomainSpec{Memory: &v1alpha1.Memory{Guest: &mem}}},
	}
	if st, err := h.Sync(ctx, vmi); err != nil || st.Phase != v1alpha1.Running {
		t.Fatalf("Sync: %v, phase %s", err, st.Phase)
	}
	e := startServer(t, h)

	c := e.mustDial(t, nodeapi.VMIPath("default", "vm1", "console"))
	readUntil(t, c, fake.ConsoleMarker)
	if _, err := c.Write([]byte("root\r")); err != nil {
		t.Fatal(err)
	}
	readUntil(t, c, "root\r")

	if st := e.status(t, http.MethodPut, nodeapi.VMIPath("default", "vm1", "pause")); st.Code != 200 {
		t.Fatalf("pause: %d %q", st.Code, st.Message)
	}
	st, _ := h.Status(vmi.UID)
	if !hasCondition(st, v1alpha1.VirtualMachineInstancePaused) {
		t.Errorf("VMI status after pause has no Paused condition: %+v", st.Conditions)
	}
	if st := e.status(t, http.MethodPut, nodeapi.VMIPath("default", "vm1", "pause")); st.Code != http.StatusConflict {
		t.Errorf("pause of a paused VMI: %d %q, want 409", st.Code, st.Message)
	}
	if st := e.status(t, http.MethodPut, nodeapi.VMIPath("default", "vm1", "unpause")); st.Code != 200 {
		t.Fatalf("unpause: %d %q", st.Code, st.Message)
	}
	if st, _ := h.Status(vmi.UID); hasCondition(st, v1alpha1.VirtualMachineInstancePaused) {
		t.Errorf("VMI status after unpause still Paused: %+v", st.Conditions)
	}
	if st := e.status(t, http.MethodPut, nodeapi.VMIPath("default", "vm1", "softreboot")); st.Code != 200 {
		t.Errorf("softreboot: %d %q, want 200 (the fake driver offers it)", st.Code, st.Message)
	}
	if resp, err := e.do(http.MethodGet, nodeapi.VMIPath("default", "vm1", "guestosinfo"), nil); err != nil {
		t.Errorf("guestosinfo: %v", err)
	} else {
		var info subv1.GuestOSInfo
		err := json.NewDecoder(resp.Body).Decode(&info)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || err != nil || info.Kind != "GuestOSInfo" || info.Name != fake.FakeGuestOS.Name {
			t.Errorf("guestosinfo: %d %+v %v, want 200 with the fake driver's simulated agent's OS", resp.StatusCode, info, err)
		}
	}
	if st := e.status(t, http.MethodPut, nodeapi.VMIPath("default", "vm2", "pause")); st.Code != http.StatusNotFound {
		t.Errorf("pause of a VMI the handler does not run: %d %q, want 404", st.Code, st.Message)
	}
}

func hasCondition(st v1alpha1.VirtualMachineInstanceStatus, typ v1alpha1.VirtualMachineInstanceConditionType) bool {
	c := v1alpha1.InstanceCondition(st.Conditions, typ)
	return c != nil && c.Status == corev1.ConditionTrue
}
