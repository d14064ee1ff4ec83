package mpsdaemon

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Bounds of a daemon's log directory, which is on the host's disk (under the
// kubelet's plugin directory): the control daemon and every MPS server of
// the domain append to their logs for as long as the daemon runs.
const (
	// DefaultLogLimit is the size past which a log is cut.
	DefaultLogLimit = 8 << 20
	// logKeep is how much of the end of a cut log is kept, in <name>.1.
	logKeep = 1 << 20
	// DefaultLogCheckInterval is how often the logs are looked at.
	DefaultLogCheckInterval = 30 * time.Second
)

// boundLogs cuts every *.log in dir that is larger than limit: its last
// logKeep bytes go to <name>.1 (replacing the one before) and the log is
// truncated in place, which the daemon and its servers keep appending to
// (they hold it open; a rename would not free the space). A log is thus at
// most limit plus what is written between two checks, and its .1 at most
// logKeep.
func boundLogs(dir string, limit int64) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []string
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".log") {
			continue
		}
		fi, err := e.Info()
		if err != nil || fi.Size() <= limit {
			continue
		}
		if err := cutLog(filepath.Join(dir, e.Name()), fi.Size(), limit); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("bound the MPS logs in %s: %s", dir, strings.Join(errs, "; "))
	}
	return nil
}

func cutLog(path string, size, limit int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	keep := min(size, logKeep)
	tmp := path + ".1.tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, io.NewSectionReader(f, size-keep, keep))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path+".1")
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "[%s] tessera mps-daemon: cut this log at %d bytes (over %d); its last %d bytes are in %s.1\n",
		time.Now().UTC().Format(time.RFC3339), size, limit, keep, filepath.Base(path))
	return err
}

// watchLogs bounds the logs in dir (boundLogs) every interval until ctx ends.
func watchLogs(ctx context.Context, dir string, limit int64, interval time.Duration, log io.Writer) {
	if limit <= 0 {
		limit = DefaultLogLimit
	}
	if interval <= 0 {
		interval = DefaultLogCheckInterval
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		if err := boundLogs(dir, limit); err != nil {
			fmt.Fprintln(log, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
