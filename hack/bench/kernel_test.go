package bench

import (
	"reflect"
	"testing"
)

func TestKernelWatcher(t *testing.T) {
	var w KernelWatcher
	for _, chunk := range []string{
		"HB-12.5\r\n[   40.1] list_del corr", "uption, ffff8880 ->next is NULL\r\n",
		"HB-12.6\r\n# echo BUG\r\n", "[   41.0] BUG: Bad page state in process dd  pfn:0x5a3f\n",
		"[   41.2] Oops: 0000 [#1] SMP\r\n", "a line in progress: Kernel pan",
	} {
		if _, err := w.Write([]byte(chunk)); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{
		"[   40.1] list_del corruption, ffff8880 ->next is NULL",
		"[   41.0] BUG: Bad page state in process dd  pfn:0x5a3f",
		"[   41.2] Oops: 0000 [#1] SMP",
	}
	if got := w.Trouble(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Trouble() = %q, want %q", got, want)
	}
	var quiet KernelWatcher
	_, _ = quiet.Write([]byte("HB-1.0\r\nwhile :; do dd if=/dev/zero of=/tmp/kv-dirty bs=1M count=32; done\r\n"))
	if got := quiet.Trouble(); got != nil {
		t.Fatalf("a quiet console: Trouble() = %q, want nil", got)
	}
}
