//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/tests/e2e/framework"
)

// cluster is the cluster every test uses; TestMain sets it. Tests get it from
// needCluster.
var cluster *framework.Cluster

// needCluster returns the cluster under test, or fails the test saying how to
// give it one.
func needCluster(t testing.TB) *framework.Cluster {
	t.Helper()
	if cluster == nil {
		t.Fatal("no cluster: set KUBECONFIG, or TESSERA_E2E_START=1 to start the local one (see tests/e2e/README.md)")
	}
	return cluster
}

// needDriver is needCluster for a test of the driver: it skips (or, when the
// suite installed Tessera, fails) unless these DeviceClasses and the
// driver's ResourceSlices exist (RequireDriver).
func needDriver(t testing.TB, deviceClasses ...string) *framework.Cluster {
	t.Helper()
	c := needCluster(t)
	c.RequireDriver(t, deviceClasses...)
	return c
}

// TestMain finds the cluster:
//   - KUBECONFIG set: that cluster (Tessera installed or not; tests that need the
//     driver skip without it);
//   - TESSERA_E2E_START=1: demo/clusters/local/cluster.sh up (and install.sh when
//     TESSERA_E2E_INSTALL=1), and cluster.sh down after the tests unless
//     TESSERA_E2E_KEEP=1.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	kubeconfig := os.Getenv("KUBECONFIG")
	if os.Getenv("TESSERA_E2E_START") == "1" {
		if os.Getenv("TESSERA_CLUSTER_LOCK_HELD") != "1" {
			unlock, err := lockCluster(time.Hour)
			if err != nil {
				fmt.Fprintln(os.Stderr, "e2e:", err)
				return 1
			}
			defer unlock()
		}
		local := filepath.Join(framework.RepoRoot, "demo", "clusters", "local")
		if err := script(filepath.Join(local, "cluster.sh"), "up"); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 1
		}
		if os.Getenv("TESSERA_E2E_KEEP") != "1" {
			defer func() {
				if err := script(filepath.Join(local, "cluster.sh"), "down"); err != nil {
					fmt.Fprintln(os.Stderr, "e2e:", err)
				}
			}()
		}
		if os.Getenv("TESSERA_E2E_INSTALL") == "1" {
			if err := script(filepath.Join(local, "install.sh")); err != nil {
				fmt.Fprintln(os.Stderr, "e2e:", err)
				return 1
			}
		}
		out, err := exec.Command(filepath.Join(local, "cluster.sh"), "kubeconfig").Output()
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e: cluster.sh kubeconfig:", err)
			return 1
		}
		kubeconfig = strings.TrimSpace(string(out))
	}
	if kubeconfig == "" {
		// The harness's own tests still run; the cluster tests fail in needCluster.
		return m.Run()
	}
	// Tools the tests run (helm, kubectl) talk to the same cluster.
	if err := os.Setenv("KUBECONFIG", kubeconfig); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	c, err := framework.NewCluster(kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	cluster = c
	return m.Run()
}

// script runs one of the cluster scripts, its output going to stderr.
func script(path string, args ...string) error {
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", path, strings.Join(args, " "), err)
	}
	return nil
}

// lockCluster takes the machine's local-cluster lock (the file the Makefile's
// targets flock, TESSERA_CLUSTER_LOCK or /tmp/tessera-cluster.lock) for the
// whole run, so that a second run, a demo or a benchmark does not start or
// stop the one local cluster under this one. It waits at most wait.
func lockCluster(wait time.Duration) (func(), error) {
	path := os.Getenv("TESSERA_CLUSTER_LOCK")
	if path == "" {
		path = "/tmp/tessera-cluster.lock"
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("cluster lock: %w", err)
	}
	deadline := time.Now().Add(wait)
	for said := false; ; said = true {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if err != syscall.EWOULDBLOCK || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("cluster lock %s: %v (another run holds the local cluster)", path, err)
		}
		if !said {
			fmt.Fprintf(os.Stderr, "e2e: waiting for the local cluster lock %s (another run holds it)\n", path)
		}
		time.Sleep(time.Second)
	}
}
