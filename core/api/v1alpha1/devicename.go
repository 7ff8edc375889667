package v1alpha1

import (
	"errors"
	"fmt"
	"strings"
)

// CheckDeviceName says why name cannot be the deviceName of a GPU or host device: the extended
// resource a device plugin offers, "<domain>/<name>" ("devices.kubevisor.io/gpu",
// "nvidia.com/GA102"), not a Kubernetes one. The webhook and the launcher pod builder both
// apply it.
func CheckDeviceName(name string) error {
	domain, n, ok := strings.Cut(name, "/")
	switch {
	case !ok || domain == "" || n == "" || strings.Contains(n, "/"):
		return errors.New("not an extended resource name <domain>/<name>")
	case domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io") || strings.HasPrefix(name, "requests."):
		return fmt.Errorf("not an extended resource: %s belongs to Kubernetes", domain)
	}
	return nil
}
