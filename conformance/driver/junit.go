package conformance

import (
	"encoding/xml"
	"fmt"
	"io"
	"strings"
	"time"
)

// JUnitReport is a JUnit XML report: one testsuite per suite (the name given to Recorder.Run,
// a driver kind for the CLI) with one testcase per check.
type JUnitReport struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Skipped  int          `xml:"skipped,attr"`
	Time     string       `xml:"time,attr"`
	Suites   []JUnitSuite `xml:"testsuite"`
}

// JUnitSuite is one testsuite of a JUnitReport.
type JUnitSuite struct {
	Name      string      `xml:"name,attr"`
	Tests     int         `xml:"tests,attr"`
	Failures  int         `xml:"failures,attr"`
	Errors    int         `xml:"errors,attr"`
	Skipped   int         `xml:"skipped,attr"`
	Time      string      `xml:"time,attr"`
	Timestamp string      `xml:"timestamp,attr,omitempty"`
	Cases     []JUnitCase `xml:"testcase"`
}

// JUnitCase is one testcase of a JUnitSuite: one check.
type JUnitCase struct {
	// Name is the check's name below the suite ("Lifecycle/CreateStartStatusShutdownDelete").
	Name string `xml:"name,attr"`
	// Classname is "kubevisor.conformance.<suite>".
	Classname string        `xml:"classname,attr"`
	Time      string        `xml:"time,attr"`
	Failure   *JUnitMessage `xml:"failure,omitempty"`
	Skipped   *JUnitMessage `xml:"skipped,omitempty"`
	SystemOut string        `xml:"system-out,omitempty"`
}

// JUnitMessage is the failure or skipped element of a JUnitCase.
type JUnitMessage struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

// NewJUnitReport builds the report of results, grouped into suites by the first element of
// their names, in the order the suites first appear.
func NewJUnitReport(results []Result, timestamp time.Time) JUnitReport {
	var rep JUnitReport
	index := map[string]int{}
	var total time.Duration
	durations := map[string]time.Duration{}
	for _, res := range results {
		suite, name, ok := strings.Cut(res.Name, "/")
		if !ok {
			name = suite
		}
		i, seen := index[suite]
		if !seen {
			i = len(rep.Suites)
			index[suite] = i
			s := JUnitSuite{Name: suite}
			if !timestamp.IsZero() {
				s.Timestamp = timestamp.UTC().Format("2006-01-02T15:04:05")
			}
			rep.Suites = append(rep.Suites, s)
		}
		s := &rep.Suites[i]
		c := JUnitCase{Name: name, Classname: "kubevisor.conformance." + suite, Time: seconds(res.Duration)}
		output := strings.Join(res.Output, "\n")
		switch res.Status {
		case StatusFail:
			c.Failure = &JUnitMessage{Message: firstLine(res.Message), Text: output}
			s.Failures++
		case StatusSkip:
			c.Skipped = &JUnitMessage{Message: firstLine(res.Message)}
			s.Skipped++
		default:
			c.SystemOut = output
		}
		s.Tests++
		s.Cases = append(s.Cases, c)
		durations[suite] += res.Duration
		total += res.Duration
	}
	for i := range rep.Suites {
		s := &rep.Suites[i]
		s.Time = seconds(durations[s.Name])
		rep.Tests += s.Tests
		rep.Failures += s.Failures
		rep.Skipped += s.Skipped
	}
	rep.Time = seconds(total)
	return rep
}

// WriteJUnit writes the JUnit XML report of results to w.
func WriteJUnit(w io.Writer, results []Result) error {
	rep := NewJUnitReport(results, time.Now())
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return fmt.Errorf("encode JUnit report: %w", err)
	}
	_, err := io.WriteString(w, "\n")
	return err
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.3f", d.Seconds()) }

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
