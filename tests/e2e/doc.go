//go:build e2e

// Package e2e runs Tessera against a real cluster: pods are created through the
// API, the kubelet and containerd run them, and the tests read what the
// containers print. See README.md in this directory for how to run it; the
// helpers the tests share are in package framework.
package e2e
