// Command pause is the pod sandbox's only process on the local cluster: it holds
// the pod's namespaces open, reaps zombies (it is PID 1 when the pod shares its
// PID namespace) and exits 0 on SIGTERM or SIGINT. It is built with CGO_ENABLED=0
// so the image needs nothing but this binary.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child without blocking; one SIGCHLD may stand for
// several exits.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
