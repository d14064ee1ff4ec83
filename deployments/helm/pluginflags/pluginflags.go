// Package pluginflags reads what the kubelet plugin's DaemonSet tells the
// plugin through its flags, for tests of the chart and of an installed
// release that compare it with what the plugin builds from them.
package pluginflags

import (
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/pkg/mpsdaemon"
)

// Value is the value of the flag --name=value in args, and whether it is
// there.
func Value(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// MPSDaemon is the mpsdaemon.Config a plugin started with args would use on
// node in namespace, and the MPS root it would use (--mps-root, else mps
// under --plugin-data-dir). Its Image is empty when args pass no
// --mps-image.
func MPSDaemon(args []string, namespace, node string) (mpsdaemon.Config, string) {
	arg := func(name string) (string, bool) { return Value(args, name) }
	cfg := mpsdaemon.Config{Namespace: namespace, NodeName: node}
	cfg.Image, _ = arg("mps-image")
	pull, _ := arg("mps-image-pull-policy")
	cfg.ImagePullPolicy = corev1.PullPolicy(pull)
	if s, ok := arg("mps-image-pull-secrets"); ok {
		cfg.ImagePullSecrets = strings.Split(s, ",")
	}
	cfg.PriorityClassName, _ = arg("mps-priority-class")
	_, cfg.Mock = arg("mock-profile")
	cfg.DriverRoot, _ = arg("mps-host-driver-root")
	root, ok := arg("mps-root")
	if !ok {
		dataDir, _ := arg("plugin-data-dir")
		root = filepath.Join(dataDir, "mps")
	}
	return cfg, root
}
