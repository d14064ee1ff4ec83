// Package checkpoint is the kubelet plugin's durable record of the resource
// claims it has prepared on this node, so that a plugin restart loses nothing.
//
// # Contract
//
// A [Store] holds one [Claim] per claim UID. [Store.Put] and [Store.Delete]
// are all-or-nothing: when they return nil the change is durable (it survives
// a crash of the plugin or a power loss); when they return an error the
// in-memory view is exactly what it was before the call. The only case in which
// disk and memory can disagree is an error from the very last step of a write
// (syncing the directory after the rename): the new content may then already be
// visible on disk, but is not known to be durable. Callers treat such a write as
// failed, which is safe because the next successful write rewrites the whole
// file from the in-memory state.
//
// What the plugin may assume after a crash at any point: the file holds
// either the content from before or the content from after every Put or Delete
// that was in flight, never a mix and never a torn file; a write that returned
// an error may or may not be on disk. This is why the plugin records
// [PrepareStarted] before any side effect (CDI spec, MPS daemon) and
// [PrepareCompleted] only after all of them: a claim found in PrepareStarted
// after a restart had side effects that may be half done and must be cleaned
// up or redone.
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
// A file from a newer Tessera (version "vN" with N greater than the current
// major) is refused: [Open] returns an error wrapping [ErrNewerVersion] and
// leaves the file untouched, because discarding it after a downgrade would
// silently "unprepare" claims whose containers are still running. The admin
// either upgrades again or moves the file away.
//
// # Recovery at Open
//
// [Open] never panics and never silently loses a file:
//   - missing file: first start, empty store ([RecoveryMissing]);
//   - unreadable content (not JSON, truncated, bad or missing checksum,
//     unknown version string): the file is renamed to
//     <path>.corrupt-<unix nanos> for the admin and the store starts empty
//     ([RecoveryCorrupt]);
//   - boot id differs from the one in the file: the node rebooted since the
//     claims were prepared. Nothing prepared survives a reboot: the CDI specs
//     live under /var/run (tmpfs) and MPS control daemons are processes, and
//     the kubelet prepares every claim of a running pod again after a reboot.
//     Keeping the old entries would make the plugin report devices as prepared
//     whose CDI specs no longer exist, so the store starts empty; a non-empty
//     file is first renamed to <path>.prev-boot-<unix nanos>
//     ([RecoveryRebooted]). An empty boot id, passed to Open or found in the
//     file, disables this check;
//   - the file cannot be read (permissions, I/O error), is from a newer
//     Tessera, or Open cannot write the fresh file: Open returns an error.
//     The plugin must not prepare anything it could not record.
//
// The newest five backups of each kind are kept; older ones are removed.
// Leftover temporary files from a crash mid-write are removed at Open.
package checkpoint
