package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	authnv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/core/wsstream"
)

// EditRole is the role to ask for when the subresources are forbidden.
const EditRole = "kubevisor.io:edit"

// Action is what the user asked for, in the words Explain needs.
type Action struct {
	// Command is how the user runs the CLI ("vmctl" or "kubectl vm"), for the hints.
	Command string
	// Verb is what was refused, as in "you may not <Verb> <Resource>" ("pause", "open the console of").
	Verb string
	// Resource is the parent resource (subv1.VirtualMachines or subv1.VirtualMachineInstances).
	Resource string
	// Name and Namespace name the object.
	Name, Namespace string
}

// StatusError is an answer of the server that Explain worded.
type StatusError struct {
	// Code is the HTTP status code.
	Code int
	// Status is the server's answer.
	Status metav1.Status
	msg    string
}

func (e *StatusError) Error() string { return e.msg }

// StatusOf returns the metav1.Status of a server's refusal: a REST answer (*errors.StatusError)
// or a refused WebSocket handshake (*wsstream.HTTPError, whose body is a Status or plain text).
func StatusOf(err error) (metav1.Status, bool) {
	var api apierrors.APIStatus
	if errors.As(err, &api) {
		return api.Status(), true
	}
	var he *wsstream.HTTPError
	if errors.As(err, &he) {
		var st metav1.Status
		if json.Unmarshal(he.Body, &st) != nil || st.Code == 0 {
			st = metav1.Status{Status: metav1.StatusFailure, Code: int32(he.StatusCode),
				Message: strings.TrimSpace(string(he.Body))}
		}
		if st.Code == 0 {
			st.Code = int32(he.StatusCode)
		}
		return st, true
	}
	return metav1.Status{}, false
}

// Explain turns a server's refusal into a message that says what to do; other errors come back
// as they are. For a 403 it asks the server who the user is (a SelfSubjectReview) unless the
// server's message names them.
func (c *Client) Explain(ctx context.Context, err error, a Action) error {
	st, ok := StatusOf(err)
	if !ok {
		return err
	}
	user := ""
	if st.Code == http.StatusForbidden {
		user = c.whoAmI(ctx, st.Message)
	}
	return &StatusError{Code: int(st.Code), Status: st, msg: Message(st, a, user)}
}

var userInMessage = regexp.MustCompile(`User "([^"]+)"`)

// whoAmI is the user's name: from the server's message, else a SelfSubjectReview, else the
// configured impersonation or basic-auth name, else "unknown".
func (c *Client) whoAmI(ctx context.Context, message string) string {
	if m := userInMessage.FindStringSubmatch(message); m != nil {
		return m[1]
	}
	if c.Core != nil {
		r, err := c.Core.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err == nil && r.Status.UserInfo.Username != "" {
			return r.Status.UserInfo.Username
		}
	}
	switch {
	case c.Config.Impersonate.UserName != "":
		return c.Config.Impersonate.UserName
	case c.Config.Username != "":
		return c.Config.Username
	}
	return "unknown"
}

// Message words a refusal st of action a for user (used for 403 only).
func Message(st metav1.Status, a Action, user string) string {
	kind := "VMI"
	if a.Resource == subv1.VirtualMachines {
		kind = "VM"
	}
	serverSaid := st.Message
	if serverSaid == "" {
		serverSaid = string(st.Reason)
	}
	lower := strings.ToLower(serverSaid)
	switch st.Code {
	case http.StatusUnauthorized:
		return fmt.Sprintf("the server did not accept your credentials (401 %s): check the user of your kubeconfig context, or log in again", serverSaid)
	case http.StatusForbidden:
		return fmt.Sprintf("you (%s) may not %s %s in namespace %s: ask for the %s role", user, a.Verb, a.Resource, a.Namespace, EditRole)
	case http.StatusNotFound:
		return fmt.Sprintf("%s %s not found in namespace %s (%s)", kind, a.Name, a.Namespace, serverSaid)
	case http.StatusConflict:
		switch {
		case strings.Contains(lower, "not running") || strings.Contains(lower, "is not found") || strings.Contains(lower, "not found"):
			return fmt.Sprintf("VMI %s is not running: start it with %s start %s (server: %s)", a.Name, a.Command, a.Name, serverSaid)
		case strings.Contains(lower, "paused") && a.Verb != "unpause":
			return fmt.Sprintf("VMI %s is paused: unpause it with %s unpause vmi %s (server: %s)", a.Name, a.Command, a.Name, serverSaid)
		}
		return fmt.Sprintf("%s %s: %s", kind, a.Name, serverSaid)
	case http.StatusNotImplemented:
		return serverSaid
	case http.StatusServiceUnavailable:
		return fmt.Sprintf("the subresource API is unavailable (%s): check that kubevisor-api runs (kubectl get apiservice v1alpha1.%s)", serverSaid, subv1.GroupName)
	}
	return fmt.Sprintf("%s %s %s: %d %s", a.Verb, kind, a.Name, st.Code, serverSaid)
}

// IsNotRunning reports whether err is the server's answer that the VMI does not run (409), or
// does not exist (404) yet; console --follow waits on these.
func IsNotRunning(err error) bool {
	st, ok := StatusOf(err)
	if !ok {
		var se *StatusError
		if !errors.As(err, &se) {
			return false
		}
		st = se.Status
	}
	return st.Code == http.StatusConflict || st.Code == http.StatusNotFound
}
