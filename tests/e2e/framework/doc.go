//go:build e2e

// Package framework holds what the end-to-end tests share: the cluster handle
// and its clients (Cluster), bounded waits (Poll, WaitForPod…), apply and
// delete with cleanup, one builder for claims and claim templates (Claim),
// pods that print their env and the reading of it (EnvPod, EnvPodWith,
// RunObjects, EnvOf), the checks of what a container saw (WantGPUs…), the
// plugin's state on the node, and the helm and CLI helpers.
package framework
