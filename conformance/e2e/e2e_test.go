//go:build e2e

package e2e

import (
	"flag"
	"os"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

func init() {
	flag.StringVar(&Cfg.Kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the cluster under test")
	flag.StringVar(&Cfg.Kubectl, "kubectl", Cfg.Kubectl, "kubectl binary")
	flag.StringVar(&Cfg.Vmctl, "vmctl", Cfg.Vmctl, "vmctl binary (make e2e builds bin/vmctl)")
	flag.StringVar(&Cfg.GuestImage, "guest-image", Cfg.GuestImage, "the test guest's containerDisk image")
	flag.StringVar(&Cfg.ClientImage, "client-image", Cfg.ClientImage, "image with /usr/local/bin/e2e-httpget, for requests from a pod")
	flag.StringVar(&Cfg.SignalImage, "signal-image", Cfg.SignalImage, "image with /usr/local/bin/e2e-signal, run in an ephemeral container of a handler pod to kill a driver plugin")
	flag.DurationVar(&Cfg.BootTimeout, "boot-timeout", Cfg.BootTimeout, "creation to Running")
	flag.StringVar(&Cfg.HypervisorClass, "hypervisor-class", os.Getenv("E2E_HYPERVISOR_CLASS"),
		"HypervisorClass of the specs' VMIs (default $E2E_HYPERVISOR_CLASS, else the cluster's default class)")
	flag.StringVar(&Cfg.UpgradeTag, "upgrade-tag", os.Getenv("E2E_UPGRADE_TAG"),
		"image tag the upgrade spec (label Upgrade) moves the install to and back from (default $E2E_UPGRADE_TAG; make e2e-upgrade builds that image set)")
	flag.IntVar(&Cfg.UpgradePairs, "upgrade-pairs", 1, "VMs of each of two classes the upgrade spec runs")
	flag.StringVar(&Cfg.LocalCluster, "local-cluster", "",
		"the local cluster's scripts directory (hack/cluster), when the cluster under test is the local one: the fault matrix (label Disruptive) restarts its components with them")
	flag.DurationVar(&Cfg.SoakDuration, "soak-duration", Cfg.SoakDuration, "how long the soak (label Soak) creates and deletes VMIs")
	flag.StringVar(&Cfg.TwoClasses, "two-classes", os.Getenv("E2E_TWO_CLASSES"),
		"the two HypervisorClasses of the TwoClasses spec, a,b (default $E2E_TWO_CLASSES); set, the spec fails when one is missing, unset it takes the cluster's first two and is skipped when there are fewer")
}

// TestE2E runs the cluster conformance suite: go test -tags e2e ./conformance/e2e -args
// -kubeconfig FILE [-vmctl BIN] [-hypervisor-class NAME] [-two-classes A,B]
// [-ginkgo.label-filter Conformance] [-ginkgo.junit-report FILE].
func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Kubevisor cluster conformance")
}
