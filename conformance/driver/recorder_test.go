package conformance_test

import (
	"bytes"
	"encoding/xml"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
)

func newRecorder(t *testing.T, cfg conformance.RecorderConfig) *conformance.Recorder {
	t.Helper()
	if cfg.TempDir == "" {
		cfg.TempDir = t.TempDir()
	}
	rec, err := conformance.NewRecorder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func TestRecorderOutcomes(t *testing.T) {
	var progress bytes.Buffer
	rec := newRecorder(t, conformance.RecorderConfig{Progress: &progress})
	var events []string
	var dir string
	ok := rec.Run("suite", func(t conformance.T) {
		t.Run("Group", func(t conformance.T) {
			t.Run("Pass", func(t conformance.T) { t.Logf("a note") })
			t.Run("Error", func(t conformance.T) {
				t.Errorf("first %d", 1)
				t.Errorf("second")
				events = append(events, "after Errorf")
			})
			t.Run("Fatal", func(t conformance.T) {
				t.Cleanup(func() { events = append(events, "cleanup 1") })
				t.Cleanup(func() {
					if t.Context().Err() == nil {
						events = append(events, "context not cancelled before cleanup")
					}
					events = append(events, "cleanup 2")
				})
				dir = t.TempDir()
				t.Fatalf("fatal")
				events = append(events, "after Fatalf")
			})
			t.Run("Skip", func(t conformance.T) {
				t.Skipf("not declared")
				events = append(events, "after Skipf")
			})
			t.Run("Panic", func(t conformance.T) { panic("boom") })
		})
		t.Run("Leaf with spaces", func(t conformance.T) {})
	})
	if ok {
		t.Errorf("Run reported success with failed checks")
	}
	want := []string{"after Errorf", "cleanup 2", "cleanup 1"}
	if !slices.Equal(events, want) {
		t.Errorf("events %v, want %v", events, want)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("TempDir %s not removed: %v", dir, err)
	}

	var got []string
	for _, res := range rec.Results() {
		got = append(got, string(res.Status)+" "+res.Name+" "+res.Message)
	}
	wantResults := []string{
		"PASS suite/Group/Pass ",
		"FAIL suite/Group/Error first 1",
		"FAIL suite/Group/Fatal fatal",
		"SKIP suite/Group/Skip not declared",
		"FAIL suite/Group/Panic panic: boom",
		"PASS suite/Leaf_with_spaces ",
	}
	for i := range got {
		if i < len(wantResults) && strings.HasPrefix(wantResults[i], "FAIL suite/Group/Panic") {
			got[i] = got[i][:min(len(got[i]), len(wantResults[i]))]
		}
	}
	if !slices.Equal(got, wantResults) {
		t.Errorf("results:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(wantResults, "\n"))
	}
	if s := rec.Summary(); s != "2 passed, 3 failed, 1 skipped" {
		t.Errorf("Summary() = %q", s)
	}
	out := progress.String()
	for _, line := range []string{
		"--- PASS: suite/Group/Pass (",
		"    a note\n",
		"--- FAIL: suite/Group/Error (",
		"    first 1\n    second\n",
		"--- SKIP: suite/Group/Skip (",
	} {
		if !strings.Contains(out, line) {
			t.Errorf("progress output lacks %q:\n%s", line, out)
		}
	}
	if strings.Contains(out, "suite/Group (") {
		t.Errorf("progress output reports the group itself:\n%s", out)
	}
}

func TestRecorderRunFilter(t *testing.T) {
	for _, c := range []struct {
		run, skip string
		want      []string
	}{
		{"", "", []string{"s/A/One", "s/A/Two", "s/B/One"}},
		{"A", "", []string{"s/A/One", "s/A/Two"}},
		{"/One", "", []string{"s/A/One", "s/B/One"}},
		{"A/Two|B", "", []string{"s/A/Two"}},
		{"^(A|B)$/One", "", []string{"s/A/One", "s/B/One"}},
		{"C", "", nil},
		{"", "A", []string{"s/B/One"}},
		{"", "/One", []string{"s/A/Two"}},
		{"", "A/Two", []string{"s/A/One", "s/B/One"}},
		{"A", "/One", []string{"s/A/Two"}},
		{"", "C", []string{"s/A/One", "s/A/Two", "s/B/One"}},
	} {
		rec := newRecorder(t, conformance.RecorderConfig{Run: c.run, Skip: c.skip})
		rec.Run("s", func(t conformance.T) {
			for _, g := range []string{"A", "B"} {
				t.Run(g, func(t conformance.T) {
					t.Run("One", func(conformance.T) {})
					if g == "A" {
						t.Run("Two", func(conformance.T) {})
					}
				})
			}
		})
		var got []string
		for _, res := range rec.Results() {
			got = append(got, res.Name)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("Run %q Skip %q ran %v, want %v", c.run, c.skip, got, c.want)
		}
	}
	if _, err := conformance.NewRecorder(conformance.RecorderConfig{Run: "A/("}); err == nil {
		t.Errorf("NewRecorder accepted an invalid pattern")
	}
	if _, err := conformance.NewRecorder(conformance.RecorderConfig{Skip: "A/("}); err == nil {
		t.Errorf("NewRecorder accepted an invalid skip pattern")
	}
}

func TestJUnitReport(t *testing.T) {
	rec := newRecorder(t, conformance.RecorderConfig{})
	rec.Run("hypervisor", func(t conformance.T) {
		t.Run("Lifecycle", func(t conformance.T) {
			t.Run("CreateStartStatusShutdownDelete", func(t conformance.T) { t.Logf("graceful=true") })
		})
		t.Run("Delete", func(t conformance.T) {
			t.Run("Unknown", func(t conformance.T) { t.Errorf("Delete of an unknown VM: got NotFound\nsecond line <&>") })
		})
		t.Run("Pause", func(t conformance.T) {
			t.Run("PauseResume", func(t conformance.T) { t.Skipf("driver does not declare FEATURE_HYPERVISOR_PAUSE") })
		})
	})
	rec.Run("network", func(t conformance.T) {
		t.Run("Setup", func(t conformance.T) {
			t.Run("Idempotent", func(conformance.T) { time.Sleep(2 * time.Millisecond) })
		})
	})

	var buf bytes.Buffer
	if err := conformance.WriteJUnit(&buf, rec.Results()); err != nil {
		t.Fatal(err)
	}
	var rep conformance.JUnitReport
	if err := xml.Unmarshal(buf.Bytes(), &rep); err != nil {
		t.Fatalf("parse the report back: %v\n%s", err, buf.String())
	}
	passed, failed, skipped := rec.Counts()
	if rep.Tests != passed+failed+skipped || rep.Failures != failed || rep.Skipped != skipped {
		t.Errorf("report counts tests=%d failures=%d skipped=%d, want %d %d %d", rep.Tests, rep.Failures, rep.Skipped, passed+failed+skipped, failed, skipped)
	}
	if len(rep.Suites) != 2 || rep.Suites[0].Name != "hypervisor" || rep.Suites[1].Name != "network" {
		t.Fatalf("suites %+v, want hypervisor and network", rep.Suites)
	}
	hv := rep.Suites[0]
	if hv.Tests != 3 || hv.Failures != 1 || hv.Skipped != 1 || len(hv.Cases) != 3 {
		t.Errorf("hypervisor suite: tests=%d failures=%d skipped=%d cases=%d, want 3 1 1 3", hv.Tests, hv.Failures, hv.Skipped, len(hv.Cases))
	}
	cases := map[string]conformance.JUnitCase{}
	for _, c := range hv.Cases {
		cases[c.Name] = c
		if c.Classname != "kubevisor.conformance.hypervisor" {
			t.Errorf("case %s: classname %q", c.Name, c.Classname)
		}
	}
	if c := cases["Delete/Unknown"]; c.Failure == nil || c.Failure.Message != "Delete of an unknown VM: got NotFound" || !strings.Contains(c.Failure.Text, "second line <&>") {
		t.Errorf("Delete/Unknown: failure %+v", c.Failure)
	}
	if c := cases["Pause/PauseResume"]; c.Skipped == nil || c.Skipped.Message != "driver does not declare FEATURE_HYPERVISOR_PAUSE" {
		t.Errorf("Pause/PauseResume: skipped %+v", c.Skipped)
	}
	if c := cases["Lifecycle/CreateStartStatusShutdownDelete"]; c.Failure != nil || c.Skipped != nil || c.SystemOut != "graceful=true" {
		t.Errorf("Lifecycle: %+v", c)
	}
	if c := rep.Suites[1].Cases[0]; c.Name != "Setup/Idempotent" || c.Time == "0.000" {
		t.Errorf("network case %+v, want Setup/Idempotent with a time", c)
	}
}
