package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// requestTotalMetric is the kube-apiserver's counter of the requests it served, by verb, API
// group, resource, subresource, scope, component and response code.
const requestTotalMetric = "apiserver_request_total"

// ParseRequestTotal reads apiserver_request_total from the Prometheus text exposition of a
// kube-apiserver's /metrics and sums it by verb and resource, keyed as requestKind names them:
// "list pods", "create virtualmachineinstances.kubevisor.io", "update pods/status"; the
// requests to non-resource URLs (/metrics, /healthz, discovery) are "<verb> nonresource".
func ParseRequestTotal(text []byte) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, requestTotalMetric)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue // another metric, or a longer name with this prefix
		}
		labels := map[string]string{}
		if strings.HasPrefix(rest, "{") {
			var err error
			if labels, rest, err = parseLabels(rest[1:]); err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
		}
		fields := strings.Fields(rest)
		if len(fields) < 1 {
			return nil, fmt.Errorf("line %d: no value", n)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: value: %w", n, err)
		}
		out[requestKey(labels)] += v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no %s samples", requestTotalMetric)
	}
	return out, nil
}

// requestKey names a sample of apiserver_request_total as requestKind names a request. The
// server reports HTTP methods (POST, PUT, DELETE on a collection) where requestKind has the
// API verbs (create, update, deletecollection); APPLY (server-side apply) stays apply.
func requestKey(l map[string]string) string {
	verb := strings.ToLower(l["verb"])
	switch verb {
	case "post":
		verb = "create"
	case "put":
		verb = "update"
	case "delete":
		if l["scope"] == "namespace" || l["scope"] == "cluster" {
			verb = "deletecollection"
		}
	}
	res := l["resource"]
	if res == "" {
		return verb + " " + nonResource
	}
	if g := l["group"]; g != "" {
		res += "." + g
	}
	if s := l["subresource"]; s != "" {
		res += "/" + s
	}
	return verb + " " + res
}

// nonResource is the resource of requests outside the API's resources in ParseRequestTotal's
// keys (/metrics, /healthz, discovery).
const nonResource = "nonresource"

// asServerKeys renames requestKind's keys to ParseRequestTotal's: discovery is nonresource.
func asServerKeys(counts map[string]int) map[string]float64 {
	out := map[string]float64{}
	for k, v := range counts {
		if verb, ok := strings.CutSuffix(k, " discovery"); ok {
			k = verb + " " + nonResource
		}
		out[k] += float64(v)
	}
	return out
}

// parseLabels reads `name="value",...}` (after the opening brace) and returns the labels and
// what follows the closing brace. Values may hold \\, \" and \n escapes.
func parseLabels(s string) (map[string]string, string, error) {
	labels := map[string]string{}
	for {
		s = strings.TrimLeft(s, " ,")
		if strings.HasPrefix(s, "}") {
			return labels, s[1:], nil
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 || len(s) < eq+2 || s[eq+1] != '"' {
			return nil, "", fmt.Errorf("malformed labels at %q", s)
		}
		name := strings.TrimSpace(s[:eq])
		s = s[eq+2:]
		var v strings.Builder
		closed := false
		for i := 0; i < len(s); i++ {
			c := s[i]
			if c == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					v.WriteByte('\n')
				default:
					v.WriteByte(s[i])
				}
				continue
			}
			if c == '"' {
				s, closed = s[i+1:], true
				break
			}
			v.WriteByte(c)
		}
		if !closed {
			return nil, "", fmt.Errorf("unterminated value of label %s", name)
		}
		labels[name] = v.String()
	}
}

// diffFloat returns after minus before, without zero entries.
func diffFloat(after, before map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}
