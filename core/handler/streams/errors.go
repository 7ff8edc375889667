package streams

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// httpCode is the HTTP code of a Backend error, by its gRPC code (nodeapi's table).
func httpCode(err error) int {
	switch status.Code(err) {
	case codes.OK:
		return http.StatusOK
	case codes.NotFound:
		return http.StatusNotFound
	case codes.FailedPrecondition, codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.InvalidArgument, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable:
		return http.StatusBadGateway
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.Canceled:
		return 499 // the client went away; nobody reads it
	}
	return http.StatusInternalServerError
}

// reasons are the metav1.StatusReason of each HTTP code the endpoint answers.
var reasons = map[int]metav1.StatusReason{
	http.StatusBadRequest:          metav1.StatusReasonBadRequest,
	http.StatusNotFound:            metav1.StatusReasonNotFound,
	http.StatusMethodNotAllowed:    metav1.StatusReasonMethodNotAllowed,
	http.StatusConflict:            metav1.StatusReasonConflict,
	http.StatusNotImplemented:      metav1.StatusReason("NotImplemented"),
	http.StatusBadGateway:          metav1.StatusReasonServiceUnavailable,
	http.StatusGatewayTimeout:      metav1.StatusReasonTimeout,
	http.StatusInternalServerError: metav1.StatusReasonInternalError,
}

// grpcError is an error carrying a gRPC status (status.Error's).
type grpcError interface {
	error
	GRPCStatus() *status.Status
}

// message is the words of a Backend error: its text with the gRPC status it wraps shown as the
// status's message alone ("pause: the VMI's VM is paused", not "pause: rpc error: code = ...").
func message(err error) string {
	var ge grpcError
	if errors.As(err, &ge) {
		return strings.Replace(err.Error(), ge.Error(), ge.GRPCStatus().Message(), 1)
	}
	return err.Error()
}

// writeStatus answers a metav1.Status: Success for code 200, Failure otherwise.
func writeStatus(w http.ResponseWriter, code int, msg string) {
	st := metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusSuccess, Code: int32(code), Message: msg,
	}
	if code != http.StatusOK {
		st.Status, st.Reason = metav1.StatusFailure, reasons[code]
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(st)
}

// writeError answers err as a metav1.Status with its HTTP code.
func writeError(w http.ResponseWriter, err error) {
	writeStatus(w, httpCode(err), message(err))
}
