// Package helm holds the tests of the Tessera Helm chart in tessera/: helm lint,
// golden `helm template` output, and checks that the rendered objects agree
// with the Go code (DeviceClasses with pkg/model, class configs with
// GpuConfig's strict decoding and validation, RBAC with the API calls the
// plugin makes).
//
// The tests run the pinned helm (v3.22.0) that demo/clusters/local/build-tools.sh
// builds into the tools cache; see findHelm for where they look.
package helm
