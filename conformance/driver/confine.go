package conformance

import (
	"fmt"
	"strings"
)

// confinement is how the VM checks run every launcher when WithLauncherCapabilities is given:
// as the compute container of a launcher pod of a class with those LauncherCapabilities.
type confinement struct {
	// caps are the capabilities the launcher keeps, by their securityContext names, sorted.
	caps []string
	// mask has bit n set for capability n of caps.
	mask uint64
	// setpriv is util-linux's setpriv, which applies the confinement.
	setpriv string
	// notRoot is set when the kit is not root: its launchers run as its user, unconfined.
	notRoot bool
}

// describe says what the launchers keep, for a message.
func (c *confinement) describe() string {
	keeps := "no capability"
	if len(c.caps) > 0 {
		keeps = "only " + strings.Join(c.caps, ", ")
	}
	return fmt.Sprintf("root with %s, as in a launcher pod of its class", keeps)
}
