// Command containerdisk writes the test guest's disk as a KubeVirt-style containerDisk image
// (the disk as /disk/disk.qcow2, owned by 107:107, mode 0444) for the cluster tier: an OCI image
// layout, which the local storage driver's containerDisk volumes read directly, and a `docker
// save` tarball for `ctr images import`. hack/guest/build.sh runs it:
//
//	go run ./hack/guest/containerdisk --disk _output/guest/disk.qcow2 \
//	    --layout _output/guest/containerdisk --tarball _output/guest/containerdisk.tar
//
// SOURCE_DATE_EPOCH, when set, dates the image and its files, so the same disk gives the same
// digest.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"
)

// DefaultRef is the test guest's image name.
const DefaultRef = "kubevisor/test-guest:latest"

func main() {
	var o Options
	flag.StringVar(&o.Disk, "disk", "_output/guest/disk.qcow2", "disk image `file` the container disk carries")
	flag.StringVar(&o.Layout, "layout", "_output/guest/containerdisk", "OCI image layout `directory` to write (replaced)")
	flag.StringVar(&o.Tarball, "tarball", "_output/guest/containerdisk.tar", "docker save `file` to write too (replaced; \"\" for none)")
	flag.StringVar(&o.Ref, "ref", DefaultRef, "image `name`")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "containerdisk: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	o.Created = time.Unix(0, 0)
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "containerdisk: SOURCE_DATE_EPOCH=%q is not a number of seconds\n", s)
			os.Exit(2)
		}
		o.Created = time.Unix(sec, 0)
	}
	digest, err := Write(o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "containerdisk: %v\n", err)
		os.Exit(1)
	}
	also := ""
	if o.Tarball != "" {
		also = " and " + o.Tarball
	}
	fmt.Printf("==> guest: containerDisk %s@%s: %s%s\n", o.Ref, digest, o.Layout, also)
}
