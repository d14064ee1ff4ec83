// Package checkpoint is the kubelet plugin's durable record of the resource
// claims it has prepared on this node, so that a plugin restart loses nothing.
//
// # Guarantees
//
// A [Store] holds one [Claim] per claim UID. When [Store.Put] or
// [Store.Delete] returns nil the change is durable (it survives a crash of
// the plugin or a power loss). A write is a temporary file, written, fsynced
// and closed, then renamed over the checkpoint, then a sync of the directory;
// after a failure of any one step, memory, the file and the hash [File.Refresh]
// compares against agree, so a later Refresh reports no change and Get and
// List go on showing what the file holds:
//   - a failure before the rename changed nothing: memory, file and hash are
//     as before the call and the temporary file is removed;
//   - once the rename has happened the change is made: memory and hash
//     follow the file (the new content), and if the directory sync then
//     fails the error wraps [ErrNotDurable]: the change is visible but may
//     not survive a power loss.
//
// The plugin treats every error as a failure and undoes what it did with
// further Put and Delete calls, which work as usual after either outcome.
//
// # Group commit
//
// Concurrent Put and Delete calls share writes: the calls that arrive while
// one write is in progress queue, and the next write applies all of them,
// in the order of the calls, to the claims and writes the file once. Each
// call returns when that write has finished, with its outcome: nil once the
// file with its change (and every change queued before it) is durable, and
// the write's error, for every call of the batch, otherwise (a Delete of a
// claim the store does not hold changes nothing and returns nil). Validation
// errors (no UID, unknown state, bad Config) are returned before a call
// queues, so they never fail other calls. A single call pays for one write,
// as without batching; n concurrent calls pay for about two writes instead
// of n. A batch's directory sync runs while the next batch is written;
// renames keep the order of the batches, and a batch's calls return only
// after its own directory sync. The file format is unchanged by this: every write is still the whole
// file as described below.
//
// What the plugin may assume after a crash at any point: the file holds the
// content after some prefix of the sequence of changes, that is before or
// after every change of the batch that was in flight and after every batch
// written before it, never part of a batch and never a torn file; after a power
// loss, a write that returned [ErrNotDurable] may or may not be on disk. This
// is why the plugin records [PrepareStarted] before any side effect (CDI
// spec, MPS daemon) and [PrepareCompleted] only after all of them: a claim
// found in PrepareStarted after a restart had side effects that may be half
// done and must be cleaned up or redone.
//
// # File format
//
// The checkpoint is one JSON file (written indented, mode 0600):
//
//	{
//	  "version": "v1",
//	  "bootID": "0b5c7b8e-…",
//	  "checksum": "sha256:<64 hex digits>",
//	  "claims": {
//	    "<claim uid>": {"uid": "<claim uid>", "namespace": "…", "name": "…",
//	                    "state": "PrepareCompleted", "devices": […], "config": {…}},
//	    …
//	  }
//	}
//
// The checksum covers every top-level member except "checksum" itself: it is
// SHA-256 over the top-level object without its "checksum" member, encoded as
// compact JSON with the members sorted by name, each member's value with its
// insignificant whitespace removed (Go's encoding/json compaction, which also
// escapes <, > and & in strings). Re-indenting the file keeps it valid; any
// other edit, including re-ordering keys inside a claim, invalidates it.
//
// # Versions
//
// The reader dispatches on "version": every version this Tessera ever wrote
// has a reader here, so an upgrade always loads the file its predecessor left
// (testdata/v1.json is the fixture that must always load). A file in an older
// version is rewritten in the current version at [Open] ([RecoveryOlderVersion]).
//
// A version "vN.M" is minor M of major N ("v1" is minor 0 of major 1). A
// minor version may only add members, at the top level or inside claims and
// devices, that an older reader can ignore; it keeps the checksum rule and
// the meaning of every existing member. A file in a newer minor of the
// current major (v1.3 found by a Tessera that writes v1, after a downgrade)
// is therefore read by the current major's reader: the members it knows are
// loaded, the others ignored, and the checksum, which covers every top-level
// member but "checksum", still verifies. [Open] leaves such a file as it is
// ([RecoveryNewerMinor]), so that going back to the newer Tessera before
// anything changed loses nothing; the first Put or Delete rewrites it in the
// current version, which drops the members this version does not know (and
// logs that it did).
//
// A file from a newer major (version "vN" or "vN.M" with N greater than the
// current major) is refused: [Open] returns an error wrapping
// [ErrNewerVersion] and leaves the file untouched, because discarding it
// after a downgrade would silently "unprepare" claims whose containers are
// still running. The admin either upgrades again or moves the file away.
//
// # Recovery at Open
//
// [Open] never panics and never silently loses a file:
//   - missing file: first start, empty store ([RecoveryMissing]);
//   - unreadable content (not JSON, truncated, bad or missing checksum,
//     unknown version string that is not a newer minor or major): the file
//     is copied to <path>.corrupt-<unix nanos> for the admin, replaced by an
//     empty one, and the store starts empty ([RecoveryCorrupt]). That
//     emptiness is not the truth: claims may well be prepared, their pods
//     running. [Recovery.Untrusted] is true, and the caller must not clean up
//     anything because the store lacks it; the plugin first rebuilds the
//     entries from the CDI specs on disk and records them with Put. This is
//     not stored in the fresh file: an Open after a crash before the rebuild
//     reports [RecoveryNone];
//   - a newer minor version of the current major: loaded, file kept
//     ([RecoveryNewerMinor], see Versions);
//   - boot id differs from the one in the file: the node rebooted since the
//     claims were prepared. Nothing prepared survives a reboot: the CDI specs
//     live under /var/run (tmpfs) and MPS control daemons are processes, and
//     the kubelet prepares every claim of a running pod again after a reboot.
//     Keeping the old entries would make the plugin report devices as prepared
//     whose CDI specs no longer exist, so the store starts empty; a non-empty
//     file is first copied to <path>.prev-boot-<unix nanos>
//     ([RecoveryRebooted]). An empty boot id, passed to Open or found in the
//     file, disables this check;
//   - the file cannot be read (permissions, I/O error), is from a newer
//     major version, or Open cannot write the backup or the fresh file: Open
//     returns an error and the file is still in place, so the next Open finds
//     it again. The plugin must not prepare anything it could not record.
//
// The newest five backups of each kind are kept; older ones are removed.
// Leftover temporary files from a crash mid-write are removed at Open.
package checkpoint
