// Command kwok-stages prints the Stage objects that kwokctl gives a kwok cluster
// by default, as one YAML stream for kwok's --config: nodes become Ready and keep
// a lease (node-initialize, node-heartbeat-with-lease), pods on them become
// Running and Ready (pod-ready), Job pods complete (pod-complete) and deleted
// pods go away (pod-delete). The YAML is the one embedded in the pinned kwok
// module, so it changes only with kwok's version.
package main

import (
	"fmt"
	"strings"

	nodefast "sigs.k8s.io/kwok/kustomize/stage/node/fast"
	nodelease "sigs.k8s.io/kwok/kustomize/stage/node/heartbeat-with-lease"
	podfast "sigs.k8s.io/kwok/kustomize/stage/pod/fast"
)

func main() {
	stages := []string{
		nodefast.DefaultNodeInit,
		nodelease.DefaultNodeHeartbeatWithLease,
		podfast.DefaultPodReady,
		podfast.DefaultPodComplete,
		podfast.DefaultPodDelete,
	}
	for i, s := range stages {
		if i > 0 {
			fmt.Println("---")
		}
		fmt.Println(strings.TrimSpace(s))
	}
}
