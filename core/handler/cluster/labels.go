// Package cluster connects the node handler to a Kubernetes API server: it publishes the
// drivers' capabilities as labels on the handler's Node, which launcher pods' node affinity
// selects on.
package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// LabelSource gives the capability labels of the node's drivers (handler.Handler does).
type LabelSource interface {
	NodeLabels() map[string]string
}

// DesiredLabels are the labels the handler owns on its node: the drivers' capability labels
// (with SELinuxNodeLabel, the node's SELinux mode, from handler.Handler.NodeLabels) and, when a
// hypervisor driver is healthy or degraded, SchedulableNodeLabel = "true". The labeler adds
// CPUManagerNodeLabel (cpuManagerLabels).
func DesiredLabels(capabilities map[string]string) map[string]string {
	out := maps.Clone(capabilities)
	if out == nil {
		out = map[string]string{}
	}
	for k, v := range capabilities {
		if strings.HasPrefix(k, v1alpha1.CapabilityLabelPrefix+"hypervisor.") &&
			(v == v1alpha1.DriverHealthy || v == v1alpha1.DriverDegraded) {
			out[v1alpha1.SchedulableNodeLabel] = "true"
		}
	}
	return out
}

// owned says whether the handler manages a node label: every capability label, the
// schedulable, CPU manager and SELinux labels (v1alpha1.IsHandlerNodeLabel).
func owned(key string) bool { return v1alpha1.IsHandlerNodeLabel(key) }

// NodeLabelPatch returns the JSON merge patch that turns a node's labels into desired for the
// labels the handler owns (it sets what differs and removes owned labels that are no longer
// desired), leaving every other label alone; changed is false when nothing differs.
func NodeLabelPatch(current, desired map[string]string) (patch []byte, changed bool, err error) {
	labels := map[string]*string{}
	for k, v := range desired {
		if !owned(k) {
			return nil, false, fmt.Errorf("label %q is not the handler's to set", k)
		}
		if cur, ok := current[k]; !ok || cur != v {
			labels[k] = &v
		}
	}
	for k := range current {
		if _, keep := desired[k]; owned(k) && !keep {
			labels[k] = nil // null in a merge patch removes the key
		}
	}
	if len(labels) == 0 {
		return nil, false, nil
	}
	patch, err = json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	return patch, true, err
}

// NodeLabeler keeps the handler's labels on its Node current. It watches that one Node (so a
// label removed by hand is put back) and reads Source every Interval; it patches only when
// something differs, so an idle node costs no API requests beyond its watch.
type NodeLabeler struct {
	Client kubernetes.Interface
	Node   string
	Source LabelSource
	// CPUManagerStateFile is the kubelet's CPU manager state file as the handler sees it
	// (DefaultCPUManagerStateFile on the node): CPUManagerNodeLabel is "true" while it names
	// the static policy, and absent otherwise. Empty: the handler leaves the label as it is,
	// for the admin to set.
	CPUManagerStateFile string
	Interval            time.Duration // default 5s
	Log                 hclog.Logger
	// Events, when set, records Node events on the drivers' health when Source is also a
	// HealthSource: a Warning when a driver becomes degraded or unhealthy, naming what its
	// fingerprint says (kubectl describe node shows it: the hostdev driver's
	// permittedHostDevices entry that selects no device, for example), a Normal event when it
	// is healthy again.
	Events recorder.EventRecorder
}

// cpuManagerLabels adds CPUManagerNodeLabel to desired when the kubelet runs the static CPU
// manager policy. A state file that cannot be read leaves the label out, and is logged. Without
// a state file to read, the label keeps its value on the node (current).
func (l *NodeLabeler) cpuManagerLabels(desired, current map[string]string, log hclog.Logger) {
	if l.CPUManagerStateFile == "" {
		if v, ok := current[v1alpha1.CPUManagerNodeLabel]; ok {
			desired[v1alpha1.CPUManagerNodeLabel] = v
		}
		return
	}
	static, err := CPUManagerStatic(l.CPUManagerStateFile)
	if err != nil {
		log.Warn("the kubelet's CPU manager state: "+v1alpha1.CPUManagerNodeLabel+" not set", "error", err)
		return
	}
	if static {
		desired[v1alpha1.CPUManagerNodeLabel] = "true"
	}
}

// Run publishes until ctx ends. An error patching the node is logged and retried on the next
// tick; Run returns an error only when the node's watch cannot start.
func (l *NodeLabeler) Run(ctx context.Context) error {
	interval := l.Interval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	log := l.Log
	if log == nil {
		log = hclog.NewNullLogger()
	}
	factory := informers.NewSharedInformerFactoryWithOptions(l.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", l.Node).String()
		}))
	nodes := factory.Core().V1().Nodes()
	changed := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, UpdateFunc: func(_, n any) { poke(n) },
	}); err != nil {
		return fmt.Errorf("watch node %s: %w", l.Node, err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), nodes.Informer().HasSynced) {
		return fmt.Errorf("watch node %s: %w", l.Node, ctx.Err())
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	hs, _ := l.Source.(HealthSource)
	health := &healthReporter{events: l.Events}
	for {
		node, err := nodes.Lister().Get(l.Node)
		if err != nil {
			log.Warn("node not found: capability labels not published", "node", l.Node, "error", err)
		} else {
			if err := l.publish(ctx, node, log); err != nil {
				log.Warn("publish capability labels", "node", l.Node, "error", err)
			}
			health.report(node, hs)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-changed:
		}
	}
}

// publish patches node's labels to the desired ones when they differ.
func (l *NodeLabeler) publish(ctx context.Context, node *corev1.Node, log hclog.Logger) error {
	desired := DesiredLabels(l.Source.NodeLabels())
	l.cpuManagerLabels(desired, node.Labels, log)
	patch, changed, err := NodeLabelPatch(node.Labels, desired)
	if err != nil || !changed {
		return err
	}
	if _, err := l.Client.CoreV1().Nodes().Patch(ctx, l.Node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patch node labels: %w", err)
	}
	return nil
}
