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
// the checkpoint and fsyncs the directory. Calls that arrive while a write
// is in progress are committed together by the next write (group commit):
// their changes are applied in the order of the calls, the file is written
// once for all of them, and each call returns once that write is durable,
// with that write's outcome. The next write may start while the previous
// one's directory sync runs; renames keep the order of the changes. A full disk or any other write
// error is returned naming the path, the temporary file is removed and both
// the old file and the in-memory state stay as they were. The one step after
// the rename, the directory sync, fails differently: the error wraps
// [ErrNotDurable] and memory already holds the new content, as the file does.
type File struct {
	path   string
	bootID string
	fsys   fileSystem
	logger klog.Logger

	// writeMu is held by a write from applying its changes up to the
	// rename (and by Refresh when it reloads), so that renames happen in
	// the order of the changes and the file always reflects a prefix of
	// their sequence (see commit).
	writeMu sync.Mutex
	// queueMu guards queue, the Puts and Deletes waiting for the next
	// write, in the order they were called, and leading, which is true
	// while one caller is writing a batch or has been told to write the
	// next one.
	queueMu sync.Mutex
	queue   []*change
	leading bool
	// mu guards claims. Writers replace the map (never mutate it) under mu,
	// so readers hold it only for a map lookup or copy.
	mu     sync.RWMutex
	claims map[types.UID]Claim
	// enc holds every claim of claims encoded as the file holds it, so
	// that a write encodes only the claims it changes; nil when claims were
	// replaced by a read (Open, Refresh) and not encoded since. Guarded
	// like sum's writes (writeMu, or Open).
	enc map[types.UID]encodedClaim
	// sumMu guards sum and renaming, so that Refresh can compare the file
	// with them without waiting for a write in progress.
	sumMu sync.Mutex
	// sum is the SHA-256 of the file content this File last read or wrote,
	// so Refresh can tell whether another process replaced the file.
	sum [sha256.Size]byte
	// renaming is the SHA-256 of the content a write in progress is putting
	// in place (nil when none is): from its rename until the write sets
	// sum, the file holds it.
	renaming *[sha256.Size]byte
	// own holds open the file this File last renamed into place (nil when
	// its content was last read instead, or the file could not be opened),
	// so that Refresh can tell with one stat that the file is still that one.
	own *pin
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

	f.setSum(sha256.Sum256(data), nil)
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
	return cloneOf(f.claims, uid)
}

// List implements [Store].
func (f *File) List() []Claim {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return sortedClaims(f.claims)
}

// Put implements [Store]. c must have a UID and a known State; Config, if
// set, must be valid JSON. A claim that fails these checks is refused before
// it is queued, so it never fails the other calls of a batch.
func (f *File) Put(c Claim) error {
	n, err := normalize(c)
	if err != nil {
		return fmt.Errorf("checkpoint %s: put: %w", f.path, err)
	}
	// Encoded here, concurrently with other callers, not by the writer.
	e, err := encodeClaim(n)
	if err != nil {
		return fmt.Errorf("checkpoint %s: put: %w", f.path, err)
	}
	return f.commit(&change{put: n, enc: e})
}

// Delete implements [Store].
func (f *File) Delete(uid types.UID) error {
	return f.commit(&change{del: uid})
}

// change is one Put (put set) or Delete (del set) waiting to be written.
// The writer of its batch sets err and then closes done; lead tells its
// caller to write the next batch instead.
type change struct {
	put  Claim
	enc  encodedClaim // put's encoding
	del  types.UID
	done chan struct{}
	lead chan struct{}
	err  error
}

// commit queues ch and returns once a write that contains it is durable, or
// failed. One caller at a time leads: it takes the whole queue (its own
// change and everything queued before it) as one batch, applies it to the
// claims and renames the new file into place, then hands the lead to the
// caller of the first change queued meanwhile, which writes the next batch,
// and syncs the directory. The other callers wait for their batch's outcome
// without touching any lock, so a batch of n calls wakes n goroutines once
// each.
//
// The next batch is encoded, written and fsynced while the previous one's
// directory sync runs. Renames happen under writeMu in the order of the
// batches, so the file always holds the content after some prefix of the
// changes, and a batch whose directory sync succeeded is durable together
// with every batch before it.
func (f *File) commit(ch *change) error {
	ch.done = make(chan struct{})
	ch.lead = make(chan struct{}, 1)
	f.queueMu.Lock()
	f.queue = append(f.queue, ch)
	lead := !f.leading
	f.leading = true
	f.queueMu.Unlock()
	if !lead {
		select {
		case <-ch.done:
			return ch.err
		case <-ch.lead:
		}
	}

	f.writeMu.Lock()
	f.queueMu.Lock()
	batch := f.queue
	f.queue = nil
	f.queueMu.Unlock()
	names, installed, err := f.installBatch(batch)
	f.writeMu.Unlock()
	f.passLead()
	if installed {
		err = f.syncDir()
	}
	for i, c := range batch {
		if err != nil && names[i] != "" {
			c.err = fmt.Errorf("%s: %w", names[i], err)
		}
		close(c.done)
	}
	if len(batch) > 1 {
		f.logger.V(5).Info("Wrote checkpoint changes as one batch", "changes", len(batch), "err", err)
	}
	return ch.err
}

// passLead makes the caller of the first queued change the next leader, or
// ends leading when nothing is queued.
func (f *File) passLead() {
	f.queueMu.Lock()
	defer f.queueMu.Unlock()
	if len(f.queue) == 0 {
		f.leading = false
		return
	}
	f.queue[0].lead <- struct{}{}
}

// installBatch applies the changes of batch in order to a copy of the
// claims and puts the result in place ([File.install]). It returns the name
// of each change for its error ("" for a Delete of a claim the store did not
// hold, which changes nothing and never fails), whether the file was
// renamed (the directory sync is left to the caller), and the error of a
// write that failed before the rename. A batch that changes nothing writes
// nothing. The caller holds writeMu.
func (f *File) installBatch(batch []*change) (names []string, installed bool, err error) {
	// Only writers replace f.claims and writeMu is held, so reading it
	// without mu cannot race with a change.
	next := maps.Clone(f.claims)
	names = make([]string, len(batch))
	changed := false
	for i, ch := range batch {
		if ch.del == "" {
			next[ch.put.UID] = ch.put
			names[i] = fmt.Sprintf("put claim %s", ch.put)
			changed = true
			continue
		}
		if old, ok := next[ch.del]; ok {
			delete(next, ch.del)
			names[i] = fmt.Sprintf("delete claim %s", old)
			changed = true
		}
	}
	if !changed {
		return names, false, nil
	}
	enc := f.enc
	if enc == nil {
		if enc, err = encodeClaims(f.claims); err != nil {
			return names, false, fmt.Errorf("checkpoint %s: %w", f.path, err)
		}
	}
	nextEnc := maps.Clone(enc)
	for _, ch := range batch {
		if ch.del == "" {
			nextEnc[ch.put.UID] = ch.enc
		} else {
			delete(nextEnc, ch.del)
		}
	}
	if err := f.install(next, nextEnc); err != nil {
		return names, false, err
	}
	return names, true, nil
}

// Refresh implements [Store]. While the file is the one this File last
// renamed into place (same inode, size and modification time) it costs one
// stat; otherwise one read of the file, and it decodes only when the content
// differs from what this File last read or wrote. Content
// this File wrote, including a write still in progress, is no change, and
// is recognized without waiting for that write. A file that vanished is
// written again from memory. A newer minor version is read as Open reads
// it. A file another process left unreadable, or one in a newer major
// version, is an error and changes nothing: unlike at Open, a running plugin
// must not discard claims it may be serving.
func (f *File) Refresh() (bool, error) {
	if f.stillOwn() {
		return false, nil
	}
	if data, err := f.fsys.ReadFile(f.path); err == nil && f.isOwn(sha256.Sum256(data)) {
		return false, nil
	}
	// Another process wrote, the file is gone or cannot be read: look again
	// with writes of this File held off.
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
	if f.isOwn(sum) {
		return false, nil
	}
	c, err := decode(data)
	if err != nil {
		return false, fmt.Errorf("checkpoint %s: refresh: another writer left it unreadable: %w", f.path, err)
	}
	f.swap(c.Claims)
	f.enc = nil
	f.setSum(sum, nil)
	f.newerMinor = ""
	if c.NewerMinor {
		f.newerMinor = c.Version
	}
	f.logger.V(2).Info("Reloaded checkpoint written by another instance", "claims", len(c.Claims))
	return true, nil
}

// isOwn reports whether sum is that of the content this File last read or
// wrote, or of the content a write in progress is renaming into place.
func (f *File) isOwn(sum [sha256.Size]byte) bool {
	f.sumMu.Lock()
	defer f.sumMu.Unlock()
	return sum == f.sum || (f.renaming != nil && sum == *f.renaming)
}

// stillOwn reports whether the file is the one this File last renamed into
// place, unchanged since: then it holds what this File wrote. A write of this
// File or another process in between makes it false, and so does a change in
// place unless it keeps the size and lands within the filesystem's timestamp
// granularity of the rename (no Tessera writer changes the file in place).
func (f *File) stillOwn() bool {
	// The pin stays open while it is compared: a write that replaces it
	// releases it under sumMu.
	f.sumMu.Lock()
	defer f.sumMu.Unlock()
	if f.own == nil {
		return false
	}
	fi, err := f.fsys.Stat(f.path)
	if err != nil {
		return false
	}
	id, ok := idOf(fi)
	return ok && id == f.own.id
}

// setSum records the content the file holds now, the pin of the file this
// File wrote it to (nil when it was read rather than written), and that no
// write is renaming anything.
func (f *File) setSum(sum [sha256.Size]byte, own *pin) {
	f.sumMu.Lock()
	defer f.sumMu.Unlock()
	f.own.release()
	f.sum, f.renaming, f.own = sum, nil, own
}

// setRenaming records the content a write is about to rename into place,
// or none (nil) after a write that failed before its rename.
func (f *File) setRenaming(sum *[sha256.Size]byte) {
	f.sumMu.Lock()
	defer f.sumMu.Unlock()
	f.renaming = sum
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
	enc, err := encodeClaims(claims)
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", f.path, err)
	}
	if err := f.install(claims, enc); err != nil {
		return err
	}
	return f.syncDir()
}

// install is write up to and including the rename: afterwards the file,
// memory and f.sum hold claims, but the rename is not durable until the
// directory is synced ([File.syncDir]). enc is claims encoded one by one.
// An error leaves everything as it was. The caller holds writeMu, or is
// Open.
func (f *File) install(claims map[types.UID]Claim, enc map[types.UID]encodedClaim) error {
	data, err := encodeFrom(f.bootID, enc)
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", f.path, err)
	}
	sum := sha256.Sum256(data)
	f.setRenaming(&sum)
	own, err := f.renameInto(f.path, data, true)
	if err != nil {
		f.setRenaming(nil)
		return err
	}
	f.swap(claims)
	f.enc = enc
	f.setSum(sum, own)
	if f.newerMinor != "" {
		f.logger.Info("Rewrote checkpoint of a newer minor format in the current one, dropping what this version does not know", "from", f.newerMinor, "to", CurrentVersion)
		f.newerMinor = ""
	}
	f.logger.V(5).Info("Wrote checkpoint", "claims", len(claims), "bytes", len(data))
	return nil
}

// syncDir makes renames in the checkpoint's directory durable; its error
// wraps [ErrNotDurable].
func (f *File) syncDir() error {
	if err := f.fsys.SyncDir(filepath.Dir(f.path)); err != nil {
		return fmt.Errorf("checkpoint %s: %w: fsync directory: %w", f.path, ErrNotDurable, err)
	}
	return nil
}

// replace makes data the content of target (a backup of the checkpoint):
// [File.renameInto], then a sync of the directory, whose error wraps
// [ErrNotDurable].
func (f *File) replace(target string, data []byte) error {
	if _, err := f.renameInto(target, data, false); err != nil {
		return err
	}
	if err := f.fsys.SyncDir(filepath.Dir(target)); err != nil {
		return fmt.Errorf("checkpoint %s: %w: fsync directory: %w", target, ErrNotDurable, err)
	}
	return nil
}

// renameInto writes data to a temporary file in target's directory, fsyncs
// and closes it, and renames it over target. With keep it returns the new
// target pinned ([pin]; nil when it cannot be opened or the platform has no
// inode numbers). An error leaves target as it was and removes the temporary
// file.
func (f *File) renameInto(target string, data []byte, keep bool) (_ *pin, err error) {
	var own *pin
	dir := filepath.Dir(target)
	tmp, err := f.fsys.CreateTemp(dir, tempPrefix(filepath.Base(f.path))+"*")
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: create temporary file: %w", target, err)
	}
	tmpName := tmp.Name()
	defer func() {
		if err == nil {
			return
		}
		own.release()
		_ = tmp.Close() // may be the second Close; the error is already on its way
		if rerr := f.fsys.Remove(tmpName); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			f.logger.Error(rerr, "Removing temporary checkpoint file failed", "path", tmpName)
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return nil, fmt.Errorf("checkpoint %s: write temporary file: %w", target, err)
	}
	if err := tmp.Sync(); err != nil {
		return nil, fmt.Errorf("checkpoint %s: fsync temporary file: %w", target, err)
	}
	if keep {
		// Rename keeps the inode, size and modification time.
		own = f.pin(tmpName)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("checkpoint %s: close temporary file: %w", target, err)
	}
	if err := f.fsys.Rename(tmpName, target); err != nil {
		return nil, fmt.Errorf("checkpoint %s: replace with temporary file: %w", target, err)
	}
	return own, nil
}

// pin opens name and returns it pinned, or nil when it cannot be opened or
// says no inode number.
func (f *File) pin(name string) *pin {
	file, err := f.fsys.Open(name)
	if err != nil {
		return nil
	}
	fi, err := file.Stat()
	if err == nil {
		if id, ok := idOf(fi); ok {
			return &pin{file: file, id: id}
		}
	}
	_ = file.Close()
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
