package subresources

import (
	"encoding/json"
	"fmt"
	"net/url"
	"reflect"
	"regexp"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
)

// portForwardRefusal is how every refusal of a portforward's options starts: it names the part
// of the request at fault.
var portForwardRefusal = regexp.MustCompile(`^portforward (path|port|protocol|needs a port)\b`)

// checkPortForward decodes a portforward's options as the generic API server does for a
// request with path tail tail and query query (getRequestOptions: the tail, with a leading
// slash, under subpathKey, replacing any such query parameter) and checks what
// portForwardOptions promises: an accepted request has a port in 1..65535 and protocol tcp,
// taken from the tail when there is one, which the same options as a tail give again; a refused
// one says which part is wrong.
func checkPortForward(t *testing.T, codec runtime.ParameterCodec, tail, query string) {
	q, _ := url.ParseQuery(query) // a malformed pair is left out, as url.URL.Query does
	if tail != "" && !strings.HasPrefix(tail, "/") {
		tail = "/" + tail
	}
	q[subpathKey] = []string{tail}
	var opts subv1.PortForwardOptions
	if err := codec.DecodeParameters(q, subv1.GroupVersion, &opts); err != nil {
		if !portForwardRefusal.MatchString(err.Error()) {
			t.Fatalf("tail %q query %q: refusal %q does not name the path, port or protocol", tail, query, err)
		}
		return
	}
	if opts.Port < 1 || opts.Port > 65535 || opts.Protocol != "tcp" {
		t.Fatalf("tail %q query %q: accepted port %d protocol %q", tail, query, opts.Port, opts.Protocol)
	}
	if strings.Trim(tail, "/") != "" {
		fromTail, err := portForwardOptions(url.Values{subpathKey: {tail}})
		if err != nil || fromTail.Port != opts.Port {
			t.Fatalf("tail %q query %q: options %+v, but the tail alone gives %+v, %v", tail, query, opts, fromTail, err)
		}
	}
	again, err := portForwardOptions(url.Values{subpathKey: {fmt.Sprintf("/%d/%s", opts.Port, opts.Protocol)}})
	if err != nil || again.Port != opts.Port || again.Protocol != opts.Protocol {
		t.Fatalf("tail %q query %q: options %+v, as a tail again %+v, %v", tail, query, opts, again, err)
	}
}

// checkRefusal: a refused body is a 400 that says it did not decode, or names the field.
func checkRefusal(t *testing.T, what string, body []byte, err error, field string) {
	t.Helper()
	if !apierrors.IsBadRequest(err) {
		t.Fatalf("%s refused %q with %v, not a 400", what, body, err)
	}
	if msg := err.Error(); !strings.HasPrefix(msg, "decode body: ") && (field == "" || !strings.Contains(msg, field)) {
		t.Fatalf("%s refused %q with %q, which names no field", what, body, msg)
	}
}

// checkBodies reads body as each VM action's options and checks what the action relies on: a
// grace period is never negative (0 when forced), a migration is a dry run only for dryRun
// ["All"], the accepted options written as JSON read the same again, and a refusal is a 400
// naming the field.
func checkBodies(t *testing.T, body []byte) {
	if err := decodeBody(body, &subv1.StartOptions{}); err != nil {
		checkRefusal(t, "start", body, err, "")
	}
	graceBack := func(what string, grace *int64, parse func([]byte) (*int64, error)) {
		if grace != nil && *grace < 0 {
			t.Fatalf("%s accepted %q with grace period %d", what, body, *grace)
		}
		again, err := parse(must(json.Marshal(subv1.StopOptions{GracePeriodSeconds: grace})))
		if err != nil || !reflect.DeepEqual(again, grace) {
			t.Fatalf("%s of %q: grace %v, written and read again %v, %v", what, body, grace, again, err)
		}
	}
	if grace, err := stopOptions(body); err != nil {
		checkRefusal(t, "stop", body, err, "gracePeriodSeconds")
	} else {
		var opts subv1.StopOptions
		if json.Unmarshal(body, &opts) == nil && opts.Force && (grace == nil || *grace != 0) {
			t.Fatalf("stop %q: forced, grace period %v, want 0", body, grace)
		}
		graceBack("stop", grace, stopOptions)
	}
	if grace, err := restartOptions(body); err != nil {
		checkRefusal(t, "restart", body, err, "gracePeriodSeconds")
	} else {
		graceBack("restart", grace, restartOptions)
	}
	if dryRun, err := migrateOptions(body); err != nil {
		checkRefusal(t, "migrate", body, err, "dryRun")
	} else {
		var opts subv1.MigrateOptions
		if dryRun {
			opts.DryRun = []string{"All"}
		}
		if again, err := migrateOptions(must(json.Marshal(opts))); err != nil || again != dryRun {
			t.Fatalf("migrate %q: dry run %v, written and read again %v, %v", body, dryRun, again, err)
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// FuzzRequest feeds the subresource API's request parsing: a portforward's path tail and query
// (checkPortForward, through the group's parameter codec as the generic server calls it) and a
// VM action's body (checkBodies). The seeds are the requests of this package's tests and
// vmctl's, and some malformed ones.
func FuzzRequest(f *testing.F) {
	s, err := newScheme()
	if err != nil {
		f.Fatal(err)
	}
	codec := runtime.NewParameterCodec(s)
	for _, seed := range []struct {
		tail, query, body string
	}{
		{"/80", "", ""},
		{"/22/tcp", "", `{"force":true,"gracePeriodSeconds":30}`},
		{"", "port=8080&protocol=tcp", `{"gracePeriodSeconds":-1}`},
		{"", "port=22", `{"dryRun":["All"]}`},
		{"", "", `{"dryRun":["Some"]}`},
		{"/0", "", `{"apiVersion":"subresources.kubevisor.io/v1alpha1","kind":"StopOptions","gracePeriodSeconds":0}`},
		{"/70000", "port=80", `{"gracePeriodSeconds":"30"}`},
		{"/53/udp", "", `{"force":true,"gracePeriodSeconds":-5}`},
		{"/1/tcp/x", "", `[1]`},
		{"//", "port=%zz&protocol=TCP", `{`},
		{"/+443/tcp/", "path=/9", `null`},
		{"80", "port=-1", `{"dryRun":[]}`},
		{"/ssh", "protocol=udp&port=53", `{"gracePeriodSeconds":9223372036854775807}`},
	} {
		f.Add(seed.tail, seed.query, []byte(seed.body))
	}
	f.Fuzz(func(t *testing.T, tail, query string, body []byte) {
		checkPortForward(t, codec, tail, query)
		checkBodies(t, body)
	})
}
