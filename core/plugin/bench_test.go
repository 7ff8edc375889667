package plugin

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	"github.com/kubevisor/kubevisor/core/plugin/internal/fakehv"
)

// BenchmarkPluginRoundTrip times a unary call (hypervisor Status of an existing VM) through a
// plugin process, and the same call on the same implementation in-process over gRPC (bufconn,
// driver.InProcess) and as a plain Go call. ns/op is the plugin's; the metrics give each
// path's percentiles and the ratio of the plugin's median to the in-process gRPC one.
func BenchmarkPluginRoundTrip(b *testing.B) {
	ctx := context.Background()
	h := newTestHost(b, HostConfig{})
	h.start(b, testManifest(b, "bench"))
	remote := h.hv(b, "bench")

	impl := fakehv.New("bench")
	inproc, stop, err := driver.InProcess(basev1.Kind_KIND_HYPERVISOR, impl)
	if err != nil {
		b.Fatal(err)
	}
	defer stop()
	for _, hv := range []driver.Hypervisor{remote, inproc.(driver.Hypervisor)} {
		if _, err := hv.Create(ctx, &domainv1.DomainSpec{Id: "vm-1"}); err != nil {
			b.Fatal(err)
		}
	}
	call := func(hv driver.Hypervisor) func() error {
		return func() error { _, err := hv.Status(ctx, "vm-1"); return err }
	}
	n := b.N
	// The in-process paths are timed with the timer stopped, over as many samples.
	b.StopTimer()
	direct := samples(b, n, call(impl))
	bufconn := samples(b, n, call(inproc.(driver.Hypervisor)))
	warm(b, call(remote))
	b.StartTimer()
	plugin := samples(b, n, call(remote))
	b.StopTimer()

	p50, p99 := percentile(plugin, 50), percentile(plugin, 99)
	b.ReportMetric(micros(p50), "p50-µs")
	b.ReportMetric(micros(p99), "p99-µs")
	b.ReportMetric(micros(percentile(bufconn, 50)), "inproc-p50-µs")
	b.ReportMetric(micros(percentile(bufconn, 99)), "inproc-p99-µs")
	b.ReportMetric(micros(percentile(direct, 50)), "direct-p50-µs")
	b.ReportMetric(micros(percentile(direct, 99)), "direct-p99-µs")
	b.ReportMetric(float64(p50)/float64(max(percentile(bufconn, 50), 1)), "ratio-p50")
}

// BenchmarkPluginStart times Start of a driver to ready: checksum, launch, handshake, Info,
// Configure and the reattach record. Stopping it is not timed.
func BenchmarkPluginStart(b *testing.B) {
	h := newTestHost(b, HostConfig{})
	ctx := context.Background()
	base := testManifest(b, "start")
	var total time.Duration
	for i := 0; b.Loop(); i++ {
		m := base
		m.Name = fmt.Sprintf("start-%d", i)
		m.Args = []string{"name=" + m.Name}
		t0 := time.Now()
		if err := h.Start(ctx, m); err != nil {
			b.Fatal(err)
		}
		total += time.Since(t0)
		b.StopTimer()
		if err := h.Stop(m.Name); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/start")
}

func warm(b *testing.B, f func() error) {
	for range 200 {
		if err := f(); err != nil {
			b.Fatal(err)
		}
	}
}

// samples runs f n times and returns each run's duration.
func samples(b *testing.B, n int, f func() error) []time.Duration {
	warm(b, f)
	out := make([]time.Duration, n)
	for i := range out {
		t0 := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		out[i] = time.Since(t0)
	}
	return out
}

// percentile returns the p-th percentile of d (which it sorts).
func percentile(d []time.Duration, p int) time.Duration {
	slices.Sort(d)
	i := min(len(d)*p/100, len(d)-1)
	return d[i]
}

func micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
