package streams

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/handler/nsdial"
	"github.com/kubevisor/kubevisor/drivers/fake"
)

// displayHV is the in-process fake hypervisor with a display: each Display session greets with
// the RFB version and echoes its input. The fake hypervisor offers every other ability.
type displayHV struct {
	*fake.Hypervisor
	noPause bool // leave FEATURE_HYPERVISOR_PAUSE out of Capabilities
}

func (d *displayHV) Capabilities(ctx context.Context) (*basev1.Capabilities, error) {
	caps, err := d.Hypervisor.Capabilities(ctx)
	if d.noPause && caps != nil {
		var fs []basev1.Feature
		for _, f := range caps.Features {
			if f != basev1.Feature_FEATURE_HYPERVISOR_PAUSE {
				fs = append(fs, f)
			}
		}
		caps.Features = fs
	}
	return caps, err
}

func (d *displayHV) Display(ctx context.Context, id string, in io.Reader, out io.Writer) error {
	if _, err := out.Write([]byte("RFB 003.008\n")); err != nil {
		return err
	}
	_, err := io.Copy(out, in)
	return err
}

// fakeBackend is a node handler over the in-process fake hypervisor: the VMIs in vmis, run by
// hv, their guests reached at guest from inside netns. It decides abilities with
// driver.Optional as the handler does; the display, whose feature core/driver does not know
// yet, by a type assertion.
type fakeBackend struct {
	hv      *displayHV
	vmis    map[string]types.UID // "ns/name" → uid
	display bool
	netns   string
	guest   string // host:port is built from it
}

func newFakeBackend(t *testing.T, names ...string) *fakeBackend {
	t.Helper()
	b := &fakeBackend{hv: &displayHV{Hypervisor: fake.NewHypervisor()}, vmis: map[string]types.UID{}, display: true, guest: "127.0.0.1"}
	ctx := context.Background()
	for _, n := range names {
		uid := types.UID("uid-" + n)
		b.vmis["default/"+n] = uid
		if _, err := b.hv.Create(ctx, &domainv1.DomainSpec{Id: string(uid), Name: n, Memory: &domainv1.Memory{GuestBytes: 64 << 20}}); err != nil {
			t.Fatal(err)
		}
		if err := b.hv.Start(ctx, string(uid)); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func (b *fakeBackend) state(t *testing.T, uid types.UID) hypervisorv1.State {
	t.Helper()
	vs, err := b.hv.Status(context.Background(), string(uid))
	if err != nil {
		t.Fatal(err)
	}
	return vs.GetState()
}

func (b *fakeBackend) Find(namespace, name string) (types.UID, bool) {
	uid, ok := b.vmis[namespace+"/"+name]
	return uid, ok
}

func (b *fakeBackend) running(ctx context.Context, uid types.UID, want hypervisorv1.State) error {
	vs, err := b.hv.Status(ctx, string(uid))
	if err != nil {
		return err
	}
	if vs.GetState() != want {
		return status.Errorf(codes.FailedPrecondition, "the VMI's VM is %s", driver.StateWord(vs.GetState()))
	}
	return nil
}

func (b *fakeBackend) CheckStream(ctx context.Context, uid types.UID, kind string) error {
	if kind == handler.StreamVNC && !b.display {
		return status.Error(codes.Unimplemented, `hypervisor driver "fake" does not offer a VNC display`)
	}
	return b.running(ctx, uid, hypervisorv1.State_STATE_RUNNING)
}

func (b *fakeBackend) Console(ctx context.Context, uid types.UID, in io.Reader, out io.Writer) error {
	c, ok := driver.Optional[driver.Consoler](ctx, b.hv)
	if !ok {
		return status.Error(codes.Unimplemented, "no console")
	}
	return c.Console(ctx, string(uid), in, out)
}

func (b *fakeBackend) Display(ctx context.Context, uid types.UID, in io.Reader, out io.Writer) error {
	return b.hv.Display(ctx, string(uid), in, out)
}

func (b *fakeBackend) DialGuest(ctx context.Context, uid types.UID, port int) (net.Conn, error) {
	conn, err := nsdial.Dial(ctx, b.netns, "tcp", net.JoinHostPort(b.guest, fmt.Sprint(port)))
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "dial guest: %v", err)
	}
	return conn, nil
}

func (b *fakeBackend) pauser(ctx context.Context) (driver.Pauser, error) {
	p, ok := driver.Optional[driver.Pauser](ctx, b.hv)
	if !ok {
		return nil, status.Error(codes.Unimplemented, `hypervisor driver "fake" does not offer pause (it does not declare FEATURE_HYPERVISOR_PAUSE)`)
	}
	return p, nil
}

func (b *fakeBackend) Pause(ctx context.Context, uid types.UID) error {
	p, err := b.pauser(ctx)
	if err != nil {
		return err
	}
	if err := b.running(ctx, uid, hypervisorv1.State_STATE_RUNNING); err != nil {
		return fmt.Errorf("pause: %w", err)
	}
	return p.Pause(ctx, string(uid))
}

func (b *fakeBackend) Unpause(ctx context.Context, uid types.UID) error {
	p, err := b.pauser(ctx)
	if err != nil {
		return err
	}
	if err := b.running(ctx, uid, hypervisorv1.State_STATE_PAUSED); err != nil {
		return fmt.Errorf("unpause: %w", err)
	}
	return p.Resume(ctx, string(uid))
}

func (b *fakeBackend) Reset(ctx context.Context, uid types.UID) error {
	r, _ := driver.Optional[driver.Rebooter](ctx, b.hv)
	return r.Reboot(ctx, string(uid))
}

func (b *fakeBackend) SoftReboot(ctx context.Context, uid types.UID) error {
	return status.Error(codes.Unimplemented, `hypervisor driver "fake" does not offer a soft reboot`)
}

func (b *fakeBackend) GuestOSInfo(ctx context.Context, uid types.UID) (*subv1.GuestOSInfo, error) {
	return nil, status.Error(codes.Unimplemented, "no guest agent: guest OS information is not available")
}
