// Package metricsserver serves the kubelet plugin's /metrics and /healthz the
// way Kubernetes components serve theirs:
//
//   - HTTPS only, with the admin's certificate or one generated at start
//     (self-signed; scrapers skip verification or pin it);
//   - /metrics behind the API server's delegated authentication
//     (TokenReview of the bearer token) and authorization
//     (SubjectAccessReview of "get" on the non-resource URL /metrics), as
//     controller-runtime's metrics filters and kube-rbac-proxy do, so a
//     scraper needs a ServiceAccount bound to a ClusterRole such as the
//     chart's tessera-metrics-reader;
//   - /healthz unauthenticated (the kubelet's liveness probe has no token),
//     answering 503 with the failed checks when one of them fails;
//   - every request bounded: a handler timeout, a cap on requests in flight
//     (a scrape does NVML calls and /proc reads), header and idle timeouts.
package metricsserver
