package checkpoint

import (
	"cmp"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"k8s.io/klog/v2"
)

// RecoveryKind says what [Open] found.
type RecoveryKind string

const (
	// RecoveryNone: the file was read as it is, nothing was dropped.
	RecoveryNone RecoveryKind = "None"
	// RecoveryMissing: there was no file (first start); an empty one was written.
	RecoveryMissing RecoveryKind = "Missing"
	// RecoveryCorrupt: the file could not be read; it was copied to
	// BackupPath and the store starts empty. The empty store is not the
	// truth: claims may be prepared that it does not know, see
	// [Recovery.Untrusted].
	RecoveryCorrupt RecoveryKind = "Corrupt"
	// RecoveryRebooted: the file is from an earlier boot of the node; its
	// claims are in Dropped (and, if any, the file at BackupPath) and the
	// store starts empty.
	RecoveryRebooted RecoveryKind = "Rebooted"
	// RecoveryOlderVersion: the file was in an older format version; all
	// claims were loaded and the file was rewritten in [CurrentVersion].
	RecoveryOlderVersion RecoveryKind = "OlderVersion"
	// RecoveryNewerMinor: the file was in a newer minor version of the
	// current major (v1.3 read by a Tessera that writes v1, after a
	// downgrade). All claims were loaded, ignoring members this version does
	// not know, and the file was left as it is; the first Put or Delete
	// rewrites it in [CurrentVersion], dropping those members.
	RecoveryNewerMinor RecoveryKind = "NewerMinor"
)

// Recovery is what [Open] found and did. The plugin logs Message and, for
// Corrupt and Rebooted with dropped claims, emits an event; after Corrupt it
// must not act on the store's emptiness ([Recovery.Untrusted]).
type Recovery struct {
	Kind RecoveryKind
	// Message is one human-readable sentence naming the file and the reason.
	Message string
	// BackupPath is where the previous file was moved, if it was.
	BackupPath string
	// Version is the format version found in the file, if it was readable.
	Version string
	// Dropped are the claims of a previous boot (RecoveryRebooted only),
	// sorted by UID, so the plugin can clean up anything that outlives a
	// reboot.
	Dropped []Claim
}

// LostClaims reports whether Open started empty although the previous file
// may have held claims.
func (r Recovery) LostClaims() bool {
	return r.Kind == RecoveryCorrupt || (r.Kind == RecoveryRebooted && len(r.Dropped) > 0)
}

// Untrusted reports whether the store's content is not authoritative (true
// for [RecoveryCorrupt]): the store does not know which claims are prepared.
// The caller must not clean up anything (CDI specs, daemons) on the grounds
// that the store lacks it, and should rebuild entries from other sources
// (the plugin rebuilds from the CDI specs on disk) before trusting it; Put
// works as usual for that.
//
// After a reboot ([RecoveryRebooted]) the empty store is the truth, since
// nothing prepared survives a reboot, so Untrusted is false there.
//
// Untrusted is not recorded in the file: if the plugin stops before it has
// rebuilt the entries, the next Open finds the fresh (empty or partly
// rebuilt) file and reports [RecoveryNone].
func (r Recovery) Untrusted() bool {
	return r.Kind == RecoveryCorrupt
}

const (
	corruptSuffix  = ".corrupt-"
	prevBootSuffix = ".prev-boot-"
	// keepBackups is how many backups of each kind survive; each reboot
	// makes one, so without a bound they would pile up for the node's life.
	keepBackups = 5
)

// pruneBackups removes all but the newest keepBackups files named
// <base><suffix><unix nanos> in dir. Failures are logged, not returned:
// stale backups cost disk space, not correctness.
func pruneBackups(logger klog.Logger, fsys fileSystem, dir, base, suffix string) {
	names, err := fsys.ReadDirNames(dir)
	if err != nil {
		logger.Error(err, "Listing checkpoint backups failed", "dir", dir)
		return
	}
	type backup struct {
		name  string
		nanos int64
	}
	var backups []backup
	for _, name := range names {
		stamp, ok := strings.CutPrefix(name, base+suffix)
		if !ok {
			continue
		}
		nanos, err := strconv.ParseInt(stamp, 10, 64)
		if err != nil {
			continue
		}
		backups = append(backups, backup{name, nanos})
	}
	if len(backups) <= keepBackups {
		return
	}
	slices.SortFunc(backups, func(a, b backup) int { return cmp.Compare(b.nanos, a.nanos) })
	for _, b := range backups[keepBackups:] {
		path := filepath.Join(dir, b.name)
		if err := fsys.Remove(path); err != nil {
			logger.Error(err, "Removing old checkpoint backup failed", "path", path)
			continue
		}
		logger.V(2).Info("Removed old checkpoint backup", "path", path)
	}
}
