package qmp

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// sgGetVersionNum is SG_GET_VERSION_NUM of <scsi/sg.h>: the SG driver version of a device that
// takes SG_IO. golang.org/x/sys/unix does not export the SG ioctls.
const sgGetVersionNum = 0x2282

// sgMinVersion is the SG version QEMU's scsi-block needs (3.0, the SG_IO interface).
const sgMinVersion = 30000

// sgioProblem says why path is not a block device that takes SCSI commands through SG_IO, the
// device QEMU's scsi-block passes a lun's commands to; "" when it is one. It asks the device
// its SG version, as scsi-block does when it starts.
func sgioProblem(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return err.Error()
	}
	switch m := fi.Mode(); {
	case m.IsRegular():
		return "a regular file, not a block device"
	case m&os.ModeDevice == 0 || m&os.ModeCharDevice != 0:
		return fmt.Sprintf("not a block device (mode %s)", m.Type())
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	v, err := unix.IoctlGetUint32(int(f.Fd()), sgGetVersionNum)
	if err != nil {
		return fmt.Sprintf("a block device but not a SCSI one: ioctl SG_GET_VERSION_NUM: %v", err)
	}
	if v < sgMinVersion {
		return fmt.Sprintf("SG driver version %d, below the 3.0 that SG_IO needs", v)
	}
	return ""
}
