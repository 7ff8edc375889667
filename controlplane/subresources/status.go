package subresources

import (
	"encoding/json"
	"net/http"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// writeStatus writes s as JSON with its code.
func writeStatus(w http.ResponseWriter, s *metav1.Status) {
	s.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}
	s.Status = metav1.StatusFailure
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(int(s.Code))
	_ = json.NewEncoder(w).Encode(s)
}
