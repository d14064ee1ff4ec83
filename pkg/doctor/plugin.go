package doctor

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// PluginProcess is a running kubelet plugin found in /proc.
type PluginProcess struct {
	PID int
	// Args are its arguments after the program name.
	Args []string
}

// FindPlugin returns the kubelet plugin's serving process among those in
// procRoot: a process whose program is named binary and that runs no
// subcommand (the MPS daemon pods and doctor itself run the same binary
// with one). self (this process) is never chosen. Inside the plugin's
// container (no host PID namespace) that is the container's main process;
// with the host's PID namespace every plugin on the node is visible, and
// the one in this process's mount namespace (its container) is taken; more
// than one left (the two pods of a surge update, seen from outside both) is
// an error naming them.
func FindPlugin(procRoot, binary string, self int, subcommands []string) (PluginProcess, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return PluginProcess{}, err
	}
	var found []PluginProcess
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		data, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "cmdline"))
		if err != nil || len(data) == 0 {
			continue
		}
		argv := strings.Split(string(bytes.TrimRight(data, "\x00")), "\x00")
		if filepath.Base(argv[0]) != binary {
			continue
		}
		if runsSubcommand(argv[1:], subcommands) {
			continue
		}
		found = append(found, PluginProcess{PID: pid, Args: argv[1:]})
	}
	if len(found) > 1 {
		// With the host's PID namespace every plugin on the node is
		// visible; the one of this container shares its mount namespace.
		own, err := os.Readlink(filepath.Join(procRoot, strconv.Itoa(self), "ns", "mnt"))
		if err == nil {
			same := slices.DeleteFunc(slices.Clone(found), func(p PluginProcess) bool {
				ns, err := os.Readlink(filepath.Join(procRoot, strconv.Itoa(p.PID), "ns", "mnt"))
				return err != nil || ns != own
			})
			if len(same) > 0 {
				found = same
			}
		}
	}
	switch len(found) {
	case 0:
		return PluginProcess{}, fmt.Errorf("no %s process in %s", binary, procRoot)
	case 1:
		return found[0], nil
	}
	var pids []string
	for _, p := range found {
		pids = append(pids, strconv.Itoa(p.PID))
	}
	return PluginProcess{}, errors.New("more than one " + binary + " process (pids " + strings.Join(pids, ", ") + "): pass the plugin's flags after --")
}

// runsSubcommand reports whether an argument before "--" is one of the
// subcommands (flag values cannot be those names in practice).
func runsSubcommand(args, subcommands []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if slices.Contains(subcommands, a) {
			return true
		}
	}
	return false
}
