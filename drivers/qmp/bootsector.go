package qmp

import (
	"fmt"
	"os"
)

// Markers the boot-sector guests print on the first serial port.
const (
	// ProbeBootedMarker is what the probe guest prints once it runs.
	ProbeBootedMarker = "KUBEVISOR-PROBE-BOOTED"
	// ProbeMarker is what the probe guest prints after its computation, before it makes QEMU
	// exit.
	ProbeMarker = "KUBEVISOR-PROBE-OK"
	// BootSectorMarker is what the echo guest prints each time it boots.
	BootSectorMarker = "KUBEVISOR-BOOTSECTOR-READY"
)

// ProbeBootSector returns a 512-byte MBR boot sector that SeaBIOS boots: it prints
// ProbeBootedMarker on COM1, runs a loop of 2^26 iterations (a fraction of a second under TCG,
// far less under working KVM; minutes where KVM traps every instruction, as on some nested
// hosts), prints ProbeMarker and then writes to the isa-debug-exit port (0xf4), so QEMU
// started with `-device isa-debug-exit,iobase=0xf4,iosize=0x04` exits at once (status 1).
func ProbeBootSector() []byte {
	a := newRealModeAsm()
	a.prologue()
	a.printString("booted")
	a.emit(0xBB, 0x00, 0x04) // mov bx, 0x400: outer loop count
	a.label("outer")
	a.emit(0x31, 0xC9) // xor cx, cx: 65536 inner iterations
	a.label("inner")
	a.emit(0xA3, 0x00, 0x05) // mov [0x0500], ax: a memory write
	a.emit(0x40)             // inc ax
	a.jmpShort(0xE2, "inner")
	a.emit(0x4B) // dec bx
	a.jmpShort(0x75, "outer")
	a.printString("msg")
	a.emit(0xB0, 0x00)       // mov al, 0
	a.emit(0xE6, 0xF4)       // out 0xf4, al: isa-debug-exit
	a.label("halt")          //
	a.emit(0xFA, 0xF4)       // cli; hlt
	a.jmpShort(0xEB, "halt") // jmp halt
	a.putc()
	a.data("booted", ProbeBootedMarker+"\r\n")
	a.data("msg", ProbeMarker+"\r\n")
	return a.sector()
}

// EchoBootSector returns a 512-byte MBR boot sector for tests: it prints BootSectorMarker on
// COM1 at every boot, then prints a '.' about once a second (timed by the BIOS tick counter, so
// the dots stop while the VM is paused) and echoes every byte it receives on COM1, except two
// commands: 'P' reports a panic to the pvpanic device (port 0x505) and 'S' powers the machine
// off (ACPI S5 through PM1a_CNT at 0x604, where SeaBIOS puts the PM block). With acpi it also
// enables the ACPI power button (PWRBTN_EN in PM1a_EN at 0x602) and
// powers off when it is pressed (PWRBTN_STS in PM1a_STS at 0x600); without,
// it ignores the power button, so a graceful shutdown of it times out.
func EchoBootSector(acpi bool) []byte {
	a := newRealModeAsm()
	a.prologue()
	if acpi {
		// Before the marker: once it is out, a press of the button must not be lost.
		a.emit(0xBA, 0x02, 0x06) // mov dx, 0x602: PM1a_EN
		a.emit(0xB8, 0x00, 0x01) // mov ax, 0x100: PWRBTN_EN, or QEMU does not report the button
		a.emit(0xEF)             // out dx, ax
	}
	a.printString("msg")
	a.emit(0xA1, 0x6C, 0x04) // mov ax, [0x046c]: BIOS tick count
	a.emit(0xA3, 0x00, 0x05) // mov [0x0500], ax: last tick a dot was printed
	a.label("loop")
	if acpi {
		a.emit(0xBA, 0x00, 0x06)  // mov dx, 0x600: PM1a_STS
		a.emit(0xED)              // in ax, dx
		a.emit(0xF6, 0xC4, 0x01)  // test ah, 1: PWRBTN_STS (bit 8)
		a.jmpShort(0x75, "power") // jnz power
	}
	a.emit(0xBA, 0xFD, 0x03) // mov dx, 0x3fd: line status register
	a.emit(0xEC)             // in al, dx
	a.emit(0xA8, 0x01)       // test al, 1: data ready?
	a.jmpShort(0x74, "tick") // jz tick
	a.emit(0xBA, 0xF8, 0x03) // mov dx, 0x3f8
	a.emit(0xEC)             // in al, dx
	a.emit(0x3C, 'P')        // cmp al, 'P'
	a.jmpShort(0x74, "panic")
	a.emit(0x3C, 'S') // cmp al, 'S'
	a.jmpShort(0x74, "power")
	a.call("putc") // echo it
	a.jmpShort(0xEB, "loop")
	a.label("tick")
	a.emit(0xA1, 0x6C, 0x04)       // mov ax, [0x046c]
	a.emit(0x2B, 0x06, 0x00, 0x05) // sub ax, [0x0500]
	a.emit(0x83, 0xF8, 18)         // cmp ax, 18 (≈ 1 s at 18.2 Hz)
	a.jmpShort(0x72, "sleep")      // jb sleep
	a.emit(0xA1, 0x6C, 0x04)       // mov ax, [0x046c]
	a.emit(0xA3, 0x00, 0x05)       // mov [0x0500], ax
	a.emit(0xB0, '.')              // mov al, '.'
	a.call("putc")
	a.label("sleep")
	a.emit(0xF4) // hlt: until the next timer interrupt
	a.jmpShort(0xEB, "loop")
	a.label("panic")
	a.emit(0xBA, 0x05, 0x05) // mov dx, 0x505: pvpanic
	a.emit(0xB0, 0x01)       // mov al, 1: panicked
	a.emit(0xEE)             // out dx, al
	a.jmpShort(0xEB, "loop")
	a.label("power")
	a.emit(0xBA, 0x04, 0x06) // mov dx, 0x604: PM1a_CNT
	a.emit(0xB8, 0x00, 0x20) // mov ax, 0x2000: SLP_EN, SLP_TYP 0 (S5 in QEMU's DSDT)
	a.emit(0xEF)             // out dx, ax
	a.jmpShort(0xEB, "loop")
	a.putc()
	a.data("msg", "\r\n"+BootSectorMarker+"\r\n")
	return a.sector()
}

// BootDiskSize is the size of the raw disk image a boot sector is written into: SeaBIOS does not
// boot from AHCI or virtio disks much smaller than this.
const BootDiskSize = 1 << 20

// WriteBootDisk writes a raw disk image holding sector to path.
func WriteBootDisk(path string, sector []byte) error {
	img := make([]byte, BootDiskSize)
	copy(img, sector)
	return os.WriteFile(path, img, 0o644)
}

// realModeAsm assembles the few 16-bit instructions the boot sectors use, with labels.
type realModeAsm struct {
	b      []byte
	labels map[string]int
	fixups []fixup
}

type fixup struct {
	at    int // offset of the operand
	label string
	kind  int // 1: rel8, 2: rel16, 3: abs16 (linear address of the label)
}

// loadAddr is where the BIOS loads a boot sector.
const loadAddr = 0x7C00

func newRealModeAsm() *realModeAsm { return &realModeAsm{labels: map[string]int{}} }

func (a *realModeAsm) emit(b ...byte)    { a.b = append(a.b, b...) }
func (a *realModeAsm) label(name string) { a.labels[name] = len(a.b) }
func (a *realModeAsm) ref(label string, kind, size int) {
	a.fixups = append(a.fixups, fixup{at: len(a.b), label: label, kind: kind})
	a.b = append(a.b, make([]byte, size)...)
}

// jmpShort emits a short jump (EB) or conditional jump (7x) to label.
func (a *realModeAsm) jmpShort(op byte, label string) { a.emit(op); a.ref(label, 1, 1) }

// call emits a near call to label.
func (a *realModeAsm) call(label string) { a.emit(0xE8); a.ref(label, 2, 2) }

// data places a NUL-terminated string at label.
func (a *realModeAsm) data(label, s string) { a.label(label); a.emit([]byte(s)...); a.emit(0) }

// prologue sets up segments and a stack below the boot sector, with interrupts on.
func (a *realModeAsm) prologue() {
	a.emit(0xFA)             // cli
	a.emit(0x31, 0xC0)       // xor ax, ax
	a.emit(0x8E, 0xD8)       // mov ds, ax
	a.emit(0x8E, 0xD0)       // mov ss, ax
	a.emit(0xBC, 0x00, 0x7C) // mov sp, 0x7c00
	a.emit(0xFB, 0xFC)       // sti; cld
}

// printString prints the NUL-terminated string at label with putc.
func (a *realModeAsm) printString(label string) {
	a.emit(0xBE) // mov si, label
	a.ref(label, 3, 2)
	a.label("print." + label)
	a.emit(0xAC)       // lodsb
	a.emit(0x84, 0xC0) // test al, al
	a.jmpShort(0x74, "printed."+label)
	a.call("putc")
	a.jmpShort(0xEB, "print."+label)
	a.label("printed." + label)
}

// putc is the subroutine that writes AL to COM1 once its transmitter is empty (clobbers AH, DX).
func (a *realModeAsm) putc() {
	a.label("putc")
	a.emit(0x88, 0xC4)       // mov ah, al
	a.emit(0xBA, 0xFD, 0x03) // mov dx, 0x3fd
	a.label("putc.wait")
	a.emit(0xEC)       // in al, dx
	a.emit(0xA8, 0x20) // test al, 0x20: transmitter holding register empty?
	a.jmpShort(0x74, "putc.wait")
	a.emit(0x88, 0xE0)       // mov al, ah
	a.emit(0xBA, 0xF8, 0x03) // mov dx, 0x3f8
	a.emit(0xEE)             // out dx, al
	a.emit(0xC3)             // ret
}

// sector resolves the labels and pads the code to a 512-byte sector with the 0x55AA signature.
func (a *realModeAsm) sector() []byte {
	for _, f := range a.fixups {
		target, ok := a.labels[f.label]
		if !ok {
			panic(fmt.Sprintf("bootsector: undefined label %q", f.label))
		}
		switch f.kind {
		case 1:
			rel := target - (f.at + 1)
			if rel < -128 || rel > 127 {
				panic(fmt.Sprintf("bootsector: short jump to %q out of range", f.label))
			}
			a.b[f.at] = byte(int8(rel))
		case 2:
			rel := target - (f.at + 2)
			a.b[f.at], a.b[f.at+1] = byte(rel), byte(rel>>8)
		case 3:
			addr := loadAddr + target
			a.b[f.at], a.b[f.at+1] = byte(addr), byte(addr>>8)
		}
	}
	if len(a.b) > 510 {
		panic("bootsector: code does not fit in 510 bytes")
	}
	out := make([]byte, 512)
	copy(out, a.b)
	out[510], out[511] = 0x55, 0xAA
	return out
}
