package cmd

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"image"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubevisor/kubevisor/core/wsstream"
	"github.com/kubevisor/kubevisor/internal/rfb/rfbtest"
	"github.com/kubevisor/kubevisor/internal/syncbuf"
)

const (
	testToken = "test-token"
	testNS    = "ns1"
	subPrefix = "/apis/subresources.kubevisor.io/v1alpha1/namespaces/" + testNS + "/"
)

// fakeServer speaks the paths vmctl uses: the subresource API (actions, streams through
// core/wsstream), kubevisor.io objects, services and SelfSubjectReviews. It requires the bearer
// token of the kubeconfig it writes.
type fakeServer struct {
	t   *testing.T
	srv *httptest.Server
	// refusals maps "resource/name/subresource" to the status the server answers.
	refusals map[string]metav1.Status
	// console serves a console stream; echo with a prefix when nil.
	console func(net.Conn)
	// framebuffer is the VNC display.
	framebuffer image.Image

	mu       sync.Mutex
	requests []recorded
}

type recorded struct {
	Method, Path string
	Body         []byte
}

func newFakeServer(t *testing.T) *fakeServer {
	f := &fakeServer{t: t, refusals: map[string]metav1.Status{}}
	f.srv = httptest.NewTLSServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

// refuse sets (or with a zero status clears) the answer to key.
func (f *fakeServer) refuse(key string, st metav1.Status) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st.Code == 0 {
		delete(f.refusals, key)
		return
	}
	f.refusals[key] = st
}

func (f *fakeServer) recorded(method, path string) []recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []recorded
	for _, r := range f.requests {
		if r.Method == method && r.Path == path {
			out = append(out, r)
		}
	}
	return out
}

func writeStatus(w http.ResponseWriter, st metav1.Status) {
	st.Kind, st.APIVersion, st.Status = "Status", "v1", metav1.StatusFailure
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(int(st.Code))
	_ = json.NewEncoder(w).Encode(st)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func (f *fakeServer) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+testToken {
		writeStatus(w, metav1.Status{Code: 401, Reason: metav1.StatusReasonUnauthorized, Message: "Unauthorized"})
		return
	}
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.requests = append(f.requests, recorded{r.Method, r.URL.Path, body})
	f.mu.Unlock()

	switch p := r.URL.Path; {
	case p == "/apis/subresources.kubevisor.io/v1alpha1/version":
		writeJSON(w, map[string]string{"kind": "ServerVersion", "gitVersion": "v9.9.9", "goVersion": "go1.26", "platform": "linux/amd64"})
	case p == "/apis/authentication.k8s.io/v1/selfsubjectreviews":
		writeJSON(w, map[string]any{"kind": "SelfSubjectReview", "apiVersion": "authentication.k8s.io/v1",
			"status": map[string]any{"userInfo": map[string]any{"username": "alice"}}})
	case strings.HasPrefix(p, subPrefix):
		key := strings.TrimPrefix(p, subPrefix)
		f.mu.Lock()
		st, ok := f.refusals[key]
		f.mu.Unlock()
		if ok {
			writeStatus(w, st)
			return
		}
		parts := strings.Split(key, "/")
		if len(parts) < 3 {
			http.NotFound(w, r)
			return
		}
		f.subresource(w, r, parts[2], parts[3:])
	case strings.HasPrefix(p, "/apis/kubevisor.io/v1alpha1/namespaces/"+testNS+"/virtualmachines/"):
		writeJSON(w, map[string]any{"kind": "VirtualMachine", "apiVersion": "kubevisor.io/v1alpha1",
			"metadata": map[string]any{"name": filepath.Base(p), "namespace": testNS}})
	case p == "/api/v1/namespaces/"+testNS+"/services" && r.Method == http.MethodPost:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	default:
		writeStatus(w, metav1.Status{Code: 404, Reason: metav1.StatusReasonNotFound, Message: "no such path " + p})
	}
}

func (f *fakeServer) subresource(w http.ResponseWriter, r *http.Request, sub string, extra []string) {
	switch sub {
	case "console", "vnc", "portforward":
		conn, err := wsstream.Upgrade(w, r)
		if err != nil {
			return
		}
		defer conn.Close()
		switch sub {
		case "console":
			if f.console != nil {
				f.console(conn)
				return
			}
			echo(conn)
		case "vnc":
			_ = rfbtest.Serve(conn, f.framebuffer)
		case "portforward":
			// The "guest" is a TCP server on 127.0.0.1 at the requested port.
			guest, err := net.Dial("tcp", "127.0.0.1:"+extra[0])
			if err != nil {
				return
			}
			splice(context.Background(), conn, guest)
		}
	case "guestosinfo":
		writeJSON(w, map[string]string{"kind": "GuestOSInfo", "name": "debian", "version": "12"})
	default:
		if r.Method != http.MethodPut {
			http.Error(w, "method", http.StatusMethodNotAllowed)
			return
		}
		writeJSON(w, map[string]string{})
	}
}

// echo answers every read with "echo:" and the bytes.
func echo(conn net.Conn) {
	buf := make([]byte, 4096)
	for {
		n, err := conn.Read(buf)
		if err != nil {
			return
		}
		if _, err := conn.Write(append([]byte("echo:"), buf[:n]...)); err != nil {
			return
		}
	}
}

// kubeconfig writes a kubeconfig for the fake server and returns its path.
func (f *fakeServer) kubeconfig() string {
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.srv.Certificate().Raw})
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: tester
  user:
    token: %s
contexts:
- name: fake
  context: {cluster: fake, user: tester, namespace: %s}
current-context: fake
`, f.srv.URL, b64(ca), testToken, testNS)
	path := filepath.Join(f.t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		f.t.Fatal(err)
	}
	return path
}

// run runs vmctl with args against the server, stdin in, and returns stdout, stderr and the error.
func (f *fakeServer) run(ctx context.Context, in io.Reader, args ...string) (string, string, error) {
	var out, errOut syncbuf.Buffer
	err := f.runWith(ctx, in, &out, &errOut, args...)
	return out.String(), errOut.String(), err
}

func (f *fakeServer) runWith(ctx context.Context, in io.Reader, out, errOut io.Writer, args ...string) error {
	if in == nil {
		in = bytes.NewReader(nil)
	}
	return Execute(ctx, "vmctl", append([]string{"--kubeconfig", f.kubeconfig()}, args...), IOStreams{In: in, Out: out, ErrOut: errOut})
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
