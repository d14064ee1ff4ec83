package checkpoint

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// File is the [Store] on disk: the claims live in memory and every Put and
// Delete rewrites the whole file atomically before it changes memory.
//
// Get and List never wait for disk I/O. Writes are serialized; each one
// writes a temporary file next to the checkpoint, fsyncs it, renames it over
// the checkpoint and fsyncs the directory. A full disk or any other write
// error is returned naming the path, the temporary file is removed and both
// the old file and the in-memory state stay as they were. The one step after
// the rename, the directory sync, fails differently: the error wraps
// [ErrNotDurable] and memory already holds the new content, as the file does.
type File struct {
	path   string
	bootID string
	fsys   fileSystem
	logger klog.Logger

	// writeMu serializes writers for the whole write, so that the file
	// always reflects the sequence of successful calls.
	writeMu sync.Mutex
	// mu guards claims. Writers replace the map (never mutate it) under mu,
	// so readers hold it only for a map lookup or copy.
	mu     sync.RWMutex
	claims map[types.UID]Claim
	// sum is the SHA-256 of the file content this File last read or wrote,
	// so Refresh can tell whether another process replaced the file.
	sum [sha256.Size]byte
	// newerMinor is the version of the file as last read when it is a newer
	// minor of CurrentVersion ("" otherwise): the next write downgrades it,
	// and says so in the log. Guarded like sum (writeMu, or Open).
	newerMinor string
}

var _ Store = (*File)(nil)

// ErrNotDurable is wrapped by the error of a write (Put, Delete, Refresh
// rewriting a vanished file) whose rename succeeded but whose final
// directory sync failed. The write is done: the file and the store's memory
// both hold the new content, and Refresh reports no change; only its
// durability across a power loss is unknown. Callers that treat the error as
// a failure undo the change with further Put or Delete calls.
var ErrNotDurable = errors.New("written, but the directory sync failed: the change is visible but may not survive a power loss")

// Open loads the checkpoint at path, or creates it, and returns the store
// with a [Recovery] saying what it found. bootID is the current boot id
// ([BootID]); an empty bootID disables reboot detection, and so does a file
// without one.
//
// Open returns an error, and changes nothing on disk, when the file cannot
// be read (permissions, I/O) or was written by a newer major version of the
// format (the error wraps [ErrNewerVersion]). It also returns an error when
// it cannot write: the plugin must not prepare anything it cannot record.
// Such a failure leaves the file at path as it was, so the next Open finds
// the same problem again. A write whose only failure is the directory sync
// ([ErrNotDurable]) is logged and Open goes on: the new file is already
// visible, and failing would leave it to the next Open without the Recovery
// that explains it. Every other problem is recovered from as the package
// documentation describes. Open logs with klog.FromContext(ctx).
func Open(ctx context.Context, path string, bootID string) (*File, Recovery, error) {
	return open(ctx, path, bootID, osFS{}, time.Now)
}

func open(ctx context.Context, path, bootID string, fsys fileSystem, now func() time.Time) (*File, Recovery, error) {
	if path == "" {
		return nil, Recovery{}, errors.New("checkpoint: empty path")
	}
	path = filepath.Clean(path)
	logger := klog.FromContext(ctx).WithValues("checkpoint", path)
	f := &File{
		path:   path,
		bootID: bootID,
		fsys:   fsys,
		logger: logger,
		claims: map[types.UID]Claim{},
	}
	dir, base := filepath.Split(path)
	dir = filepath.Clean(dir)
	if err := fsys.MkdirAll(dir, 0o750); err != nil {
		return nil, Recovery{}, fmt.Errorf("checkpoint %s: create directory: %w", path, err)
	}
	f.removeStaleTemps(dir, base)

	data, err := fsys.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if err := f.writeAtOpen(f.claims); err != nil {
			return nil, Recovery{}, err
		}
		rec := Recovery{Kind: RecoveryMissing, Message: fmt.Sprintf("checkpoint %s did not exist, starting empty", path)}
		logger.Info("Created empty checkpoint")
		return f, rec, nil
	}
	if err != nil {
		return nil, Recovery{}, fmt.Errorf("checkpoint %s: read: %w", path, err)
	}

	f.sum = sha256.Sum256(data)
	c, err := decode(data)
	var newer *newerError
	if errors.As(err, &newer) {
		return nil, Recovery{}, fmt.Errorf("checkpoint %s: %w (%w); refusing to start rather than forget claims that may still be in use: run the newer Tessera again, or move the file away to start empty", path, ErrNewerVersion, newer)
	}
	if err != nil {
		backup, berr := f.backUp(data, corruptSuffix, now)
		if berr != nil {
			return nil, Recovery{}, fmt.Errorf("checkpoint %s is unreadable (%v) and could not be backed up: %w", path, err, berr)
		}
		if werr := f.writeAtOpen(f.claims); werr != nil {
			return nil, Recovery{}, werr
		}
		rec := Recovery{
			Kind:       RecoveryCorrupt,
			Message:    fmt.Sprintf("checkpoint %s is unreadable (%v); copied it to %s and started empty, which does not mean that no claim is prepared", path, err, backup),
			BackupPath: backup,
		}
		logger.Error(err, "Checkpoint is unreadable, backed it up and started empty; which claims are prepared is unknown", "backup", backup)
		return f, rec, nil
	}

	if bootID != "" && c.BootID != "" && c.BootID != bootID {
		rec := Recovery{
			Kind:    RecoveryRebooted,
			Version: c.Version,
			Dropped: sortedClaims(c.Claims),
		}
		if len(c.Claims) > 0 {
			backup, err := f.backUp(data, prevBootSuffix, now)
			if err != nil {
				return nil, Recovery{}, fmt.Errorf("checkpoint %s: node rebooted, backing up the previous boot's checkpoint: %w", path, err)
			}
			rec.BackupPath = backup
			rec.Message = fmt.Sprintf("node rebooted (boot id %s, checkpoint from boot %s): nothing prepared survives a reboot, dropped %d claims from %s, copied it to %s", bootID, c.BootID, len(c.Claims), path, backup)
		} else {
			rec.Message = fmt.Sprintf("node rebooted (boot id %s, checkpoint from boot %s): checkpoint %s held no claims", bootID, c.BootID, path)
		}
		if err := f.writeAtOpen(f.claims); err != nil {
			return nil, Recovery{}, err
		}
		logger.Info("Node rebooted since the checkpoint was written, starting empty", "previousBootID", c.BootID, "bootID", bootID, "droppedClaims", len(c.Claims), "backup", rec.BackupPath)
		return f, rec, nil
	}

	if c.NewerMinor {
		// Rewriting it now would drop what the newer Tessera added, for
		// nothing: keep the file until a change has to be written anyway.
		f.claims = c.Claims
		f.newerMinor = c.Version
		logger.Info("Checkpoint is in a newer minor format, loaded it and left it as it is until the first change", "version", c.Version, "currentVersion", CurrentVersion, "claims", len(c.Claims))
		return f, Recovery{
			Kind:    RecoveryNewerMinor,
			Version: c.Version,
			Message: fmt.Sprintf("checkpoint %s is in format %s, a newer minor of the %s this Tessera writes: loaded all %d claims ignoring what %s does not know, and left the file as it is; the first change rewrites it as %s without that", path, c.Version, CurrentVersion, len(c.Claims), CurrentVersion, CurrentVersion),
		}, nil
	}

	if c.Version != CurrentVersion {
		if err := f.writeAtOpen(c.Claims); err != nil {
			return nil, Recovery{}, fmt.Errorf("checkpoint %s: rewriting version %s as %s: %w", path, c.Version, CurrentVersion, err)
		}
		logger.Info("Upgraded checkpoint format", "from", c.Version, "to", CurrentVersion, "claims", len(c.Claims))
		return f, Recovery{
			Kind:    RecoveryOlderVersion,
			Version: c.Version,
			Message: fmt.Sprintf("checkpoint %s was in format %s, rewrote it as %s with all %d claims", path, c.Version, CurrentVersion, len(c.Claims)),
		}, nil
	}

	f.claims = c.Claims
	logger.V(2).Info("Loaded checkpoint", "claims", len(c.Claims))
	return f, Recovery{
		Kind:    RecoveryNone,
		Version: c.Version,
		Message: fmt.Sprintf("loaded %d claims from checkpoint %s", len(c.Claims), path),
	}, nil
}

// writeAtOpen is write for Open, which goes on after [ErrNotDurable] (see
// Open). A power loss that undoes the rename also reboots the node, and the
// next Open handles whichever file it finds then.
func (f *File) writeAtOpen(claims map[types.UID]Claim) error {
	err := f.write(claims)
	if errors.Is(err, ErrNotDurable) {
		f.logger.Error(err, "Wrote checkpoint at start, but could not make it durable; going on")
		return nil
	}
	return err
}

// Path returns the checkpoint file's path.
func (f *File) Path() string { return f.path }

// Get implements [Store].
func (f *File) Get(uid types.UID) (Claim, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	c, ok := f.claims[uid]
	if !ok {
		return Claim{}, false
	}
	return clone(c), true
}

// List implements [Store].
func (f *File) List() []Claim {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return sortedClaims(f.claims)
}

// Put implements [Store]. c must have a UID and a known State; Config, if
// set, must be valid JSON.
func (f *File) Put(c Claim) error {
	n, err := normalize(c)
	if err != nil {
		return fmt.Errorf("checkpoint %s: put: %w", f.path, err)
	}
	f.writeMu.Lock()
	defer f.writeMu.Unlock()
	// Only writers replace f.claims and writeMu is held, so reading it
	// without mu cannot race with a change.
	next := maps.Clone(f.claims)
	next[n.UID] = n
	if err := f.write(next); err != nil {
		return fmt.Errorf("put claim %s: %w", n, err)
	}
	return nil
}

// Delete implements [Store].
func (f *File) Delete(uid types.UID) error {
	f.writeMu.Lock()
	defer f.writeMu.Unlock()
	old, ok := f.claims[uid]
	if !ok {
		return nil
	}
	next := maps.Clone(f.claims)
	delete(next, uid)
	if err := f.write(next); err != nil {
		return fmt.Errorf("delete claim %s: %w", old, err)
	}
	return nil
}

// Refresh implements [Store]. It costs one read of the file; it decodes only
// when the content differs from what this File last read or wrote. A file
// that vanished is written again from memory. A newer minor version is read
// as Open reads it. A file another process left unreadable, or one in a
// newer major version, is an error and changes nothing: unlike at Open, a
// running plugin must not discard claims it may be serving.
func (f *File) Refresh() (bool, error) {
	f.writeMu.Lock()
	defer f.writeMu.Unlock()
	data, err := f.fsys.ReadFile(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		f.logger.Info("Checkpoint file vanished, writing it again from memory")
		return false, f.write(f.claims)
	}
	if err != nil {
		return false, fmt.Errorf("checkpoint %s: refresh: %w", f.path, err)
	}
	sum := sha256.Sum256(data)
	if sum == f.sum {
		return false, nil
	}
	c, err := decode(data)
	if err != nil {
		return false, fmt.Errorf("checkpoint %s: refresh: another writer left it unreadable: %w", f.path, err)
	}
	f.swap(c.Claims)
	f.sum = sum
	f.newerMinor = ""
	if c.NewerMinor {
		f.newerMinor = c.Version
	}
	f.logger.V(2).Info("Reloaded checkpoint written by another instance", "claims", len(c.Claims))
	return true, nil
}

func (f *File) swap(next map[types.UID]Claim) {
	f.mu.Lock()
	f.claims = next
	f.mu.Unlock()
}

// write replaces the file with claims, atomically and durably, and makes
// memory and f.sum follow the file. On an error before the rename nothing
// changed: the previous file is in place, memory and f.sum are as they were
// and the temporary file is gone. Once the rename has happened, memory and
// f.sum hold the new content even if the directory sync then fails (the
// error wraps [ErrNotDurable]), so that they never disagree with the file.
// The caller holds writeMu, or is Open.
func (f *File) write(claims map[types.UID]Claim) error {
	data, err := encode(f.bootID, claims)
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", f.path, err)
	}
	err = f.replace(f.path, data)
	if err != nil && !errors.Is(err, ErrNotDurable) {
		return err
	}
	f.swap(claims)
	f.sum = sha256.Sum256(data)
	if f.newerMinor != "" {
		f.logger.Info("Rewrote checkpoint of a newer minor format in the current one, dropping what this version does not know", "from", f.newerMinor, "to", CurrentVersion)
		f.newerMinor = ""
	}
	if err != nil {
		return err
	}
	f.logger.V(5).Info("Wrote checkpoint", "claims", len(claims), "bytes", len(data))
	return nil
}

// replace makes data the content of target (the checkpoint or a backup of
// it): it writes a temporary file in target's directory, fsyncs it, renames
// it over target and fsyncs the directory. An error before the rename
// leaves target as it was and removes the temporary file; an error from
// the directory sync, after the rename, wraps [ErrNotDurable].
func (f *File) replace(target string, data []byte) (err error) {
	dir := filepath.Dir(target)
	tmp, err := f.fsys.CreateTemp(dir, tempPrefix(filepath.Base(f.path))+"*")
	if err != nil {
		return fmt.Errorf("checkpoint %s: create temporary file: %w", target, err)
	}
	tmpName := tmp.Name()
	renamed := false
	defer func() {
		if err == nil || renamed {
			return
		}
		_ = tmp.Close() // may be the second Close; the error is already on its way
		if rerr := f.fsys.Remove(tmpName); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			f.logger.Error(rerr, "Removing temporary checkpoint file failed", "path", tmpName)
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("checkpoint %s: write temporary file: %w", target, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("checkpoint %s: fsync temporary file: %w", target, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("checkpoint %s: close temporary file: %w", target, err)
	}
	if err := f.fsys.Rename(tmpName, target); err != nil {
		return fmt.Errorf("checkpoint %s: replace with temporary file: %w", target, err)
	}
	renamed = true
	if err := f.fsys.SyncDir(dir); err != nil {
		return fmt.Errorf("checkpoint %s: %w: fsync directory: %w", target, ErrNotDurable, err)
	}
	return nil
}

// tempPrefix names temporary files so that Open can find leftovers.
func tempPrefix(base string) string { return "." + base + ".tmp-" }

// removeStaleTemps removes temporary files a crash mid-write left behind.
func (f *File) removeStaleTemps(dir, base string) {
	names, err := f.fsys.ReadDirNames(dir)
	if err != nil {
		f.logger.Error(err, "Listing checkpoint directory failed", "dir", dir)
		return
	}
	for _, name := range names {
		if !strings.HasPrefix(name, tempPrefix(base)) {
			continue
		}
		p := filepath.Join(dir, name)
		if err := f.fsys.Remove(p); err != nil {
			f.logger.Error(err, "Removing stale temporary checkpoint file failed", "path", p)
			continue
		}
		f.logger.Info("Removed temporary checkpoint file left by an interrupted write", "path", p)
	}
}

// backUp writes data, the checkpoint as Open read it, to
// <path><suffix><unix nanos> and prunes old backups of that kind. It copies
// rather than renames, so that the checkpoint stays where it is until Open
// replaces it: if Open fails in between, the next Open finds the same file
// again, not a missing one that would look like a first start. The backup's
// durability is not checked ([ErrNotDurable] is ignored): the write of the
// fresh checkpoint that follows syncs the same directory.
func (f *File) backUp(data []byte, suffix string, now func() time.Time) (string, error) {
	backup := f.path + suffix + strconv.FormatInt(now().UnixNano(), 10)
	if err := f.replace(backup, data); err != nil && !errors.Is(err, ErrNotDurable) {
		return "", err
	}
	dir, base := filepath.Split(f.path)
	pruneBackups(f.logger, f.fsys, filepath.Clean(dir), base, suffix)
	return backup, nil
}
