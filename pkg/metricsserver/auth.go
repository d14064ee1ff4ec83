package metricsserver

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

// Delegated is the API server's answer to "who is this" (TokenReview) and
// "may they" (SubjectAccessReview).
type Delegated struct {
	Authenticator authenticator.Request
	Authorizer    authorizer.Authorizer
}

// NewDelegated authenticates bearer tokens with TokenReviews and authorizes
// with SubjectAccessReviews through client; answers are cached for a minute
// (allowed) and ten seconds (denied, unauthenticated) so that a Prometheus
// scraping every few seconds costs the API server one review a minute.
// Anonymous requests are not authenticated: they get 401.
func NewDelegated(client kubernetes.Interface) (Delegated, error) {
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		TokenAccessReviewClient:  client.AuthenticationV1(),
		TokenAccessReviewTimeout: 10 * time.Second,
		WebhookRetryBackoff:      &backoff,
		CacheTTL:                 time.Minute,
	}.New()
	if err != nil {
		return Delegated{}, fmt.Errorf("delegated authentication: %w", err)
	}
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: client.AuthorizationV1(),
		AllowCacheTTL:             time.Minute,
		DenyCacheTTL:              10 * time.Second,
		WebhookRetryBackoff:       &backoff,
	}.New()
	if err != nil {
		return Delegated{}, fmt.Errorf("delegated authorization: %w", err)
	}
	return Delegated{Authenticator: authn, Authorizer: authz}, nil
}

// Rate of the API client NewDelegatedForConfig makes: TokenReviews and
// SubjectAccessReviews of scrapers, cached for a minute, need few requests.
const (
	DelegatedQPS   = 2
	DelegatedBurst = 4
)

// NewDelegatedForConfig is NewDelegated with a client of its own, made from
// cfg with DelegatedQPS and DelegatedBurst: reviews of unknown tokens then
// wait on that client's rate limiter, not on the one of the caller's other
// API requests, and reach the API server at most DelegatedQPS a second.
func NewDelegatedForConfig(cfg *rest.Config) (Delegated, error) {
	c := rest.CopyConfig(cfg)
	c.QPS, c.Burst, c.RateLimiter = DelegatedQPS, DelegatedBurst, nil
	client, err := kubernetes.NewForConfig(c)
	if err != nil {
		return Delegated{}, fmt.Errorf("delegated authentication client: %w", err)
	}
	return NewDelegated(client)
}

// Protect serves next only to requests whose user may use the request's
// verb (get for GET and HEAD, the method in lower case otherwise) on its
// path as a non-resource URL: 401 without valid credentials, 403 when the
// authorizer does not allow it, 500 when it cannot be asked.
func (d Delegated) Protect(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		logger := klog.FromContext(r.Context())
		res, ok, err := d.Authenticator.AuthenticateRequest(r)
		if err != nil || !ok {
			if err != nil {
				logger.V(4).Info("Metrics request not authenticated", "remote", r.RemoteAddr, "err", err)
			}
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		verb := strings.ToLower(r.Method)
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			verb = "get"
		}
		attrs := authorizer.AttributesRecord{
			User:            res.User,
			Verb:            verb,
			Path:            r.URL.Path,
			ResourceRequest: false,
		}
		decision, reason, err := d.Authorizer.Authorize(r.Context(), attrs)
		if err != nil {
			logger.Error(err, "Metrics request authorization failed", "user", res.User.GetName(), "path", r.URL.Path)
			http.Error(w, "Authorization failed", http.StatusInternalServerError)
			return
		}
		if decision != authorizer.DecisionAllow {
			logger.V(4).Info("Metrics request forbidden", "user", res.User.GetName(), "path", r.URL.Path, "reason", reason)
			http.Error(w, fmt.Sprintf("Forbidden: user %q may not %s %s", res.User.GetName(), verb, r.URL.Path), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}
