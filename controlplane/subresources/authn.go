package subresources

import (
	"context"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"net/http"
	"strings"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
)

// rejectAnonymous wraps the delegated authenticator, which always falls back to the anonymous
// user, so that a request without credentials is answered 401 rather than authorized as
// system:anonymous, except on paths (health probes) that are allowed without authorization.
// The aggregator's own checks carry its identity in request headers, so they are unaffected.
func rejectAnonymous(a authenticator.Request, openPaths []string) authenticator.Request {
	return authenticator.RequestFunc(func(req *http.Request) (*authenticator.Response, bool, error) {
		resp, ok, err := a.AuthenticateRequest(req)
		if err != nil || !ok || resp.User.GetName() != user.Anonymous || openPath(req.URL.Path, openPaths) {
			return resp, ok, err
		}
		return nil, false, nil
	})
}

// openPath says whether path is one of paths, where a trailing * matches any tail.
func openPath(path string, paths []string) bool {
	for _, p := range paths {
		if prefix, ok := strings.CutSuffix(p, "*"); ok && strings.HasPrefix(path, prefix) || p == path {
			return true
		}
	}
	return false
}

// allowVersion wraps the delegated authorizer so that a GET of VersionPath is allowed to every
// authenticated user (anonymous requests were refused before).
func allowVersion(a authorizer.Authorizer) authorizer.Authorizer {
	return authorizer.AuthorizerFunc(func(ctx context.Context, attrs authorizer.Attributes) (authorizer.Decision, string, error) {
		if attrs.GetPath() == VersionPath && (attrs.GetVerb() == "get" || attrs.GetVerb() == "list") &&
			attrs.GetUser() != nil && attrs.GetUser().GetName() != user.Anonymous {
			return authorizer.DecisionAllow, "", nil
		}
		return a.Authorize(ctx, attrs)
	})
}
