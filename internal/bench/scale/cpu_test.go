package scale

import (
	"os"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	// pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
	line := "4242 (kube sched) (x)) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 12 0 100 0 0\n"
	got, err := parseStatCPU(line)
	if err != nil {
		t.Fatal(err)
	}
	if want := 3250 * time.Millisecond; got != want {
		t.Errorf("parseStatCPU = %s, want %s", got, want)
	}
	for _, bad := range []string{"", "1 (x) S 1 2", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 ab 1 0"} {
		if _, err := parseStatCPU(bad); err == nil {
			t.Errorf("parseStatCPU(%q) accepted", bad)
		}
	}
	if _, err := ProcessCPU(os.Getpid()); err != nil {
		t.Errorf("ProcessCPU(self): %v", err)
	}
}

func TestParseProcesses(t *testing.T) {
	got, err := ParseProcesses("kube-scheduler=12, etcd=7")
	if err != nil || len(got) != 2 || got["kube-scheduler"] != 12 || got["etcd"] != 7 {
		t.Fatalf("ParseProcesses = %v, %v", got, err)
	}
	if got, err := ParseProcesses(""); err != nil || len(got) != 0 {
		t.Errorf("empty: %v, %v", got, err)
	}
	for _, bad := range []string{"x", "x=", "=3", "x=-1", "x=a"} {
		if _, err := ParseProcesses(bad); err == nil {
			t.Errorf("ParseProcesses(%q) accepted", bad)
		}
	}
	d := cpuSince(map[string]time.Duration{"a": time.Second, "b": time.Second}, map[string]time.Duration{"a": 3 * time.Second, "c": time.Second})
	if len(d) != 1 || d["a"] != 2*time.Second {
		t.Errorf("cpuSince = %v", d)
	}
}
