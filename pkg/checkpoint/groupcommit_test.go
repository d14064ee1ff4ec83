package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
)

// waitFor polls cond until it holds; it fails the test after a generous
// bound, so that a bug shows as a failure rather than a hang. Nothing here
// asserts how long anything takes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// queued is how many changes wait for the next write.
func (f *File) queued() int {
	f.queueMu.Lock()
	defer f.queueMu.Unlock()
	return len(f.queue)
}

// gate holds the first write that reaches one step until released, and
// counts how often the step ran.
type gate struct {
	calls   atomic.Int32
	entered chan struct{}
	release chan struct{}
	// then, if set, is the hook's result for every call after the first.
	then func(call int32) error
}

func newGate() *gate {
	return &gate{entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *gate) hook() error {
	n := g.calls.Add(1)
	if n == 1 {
		close(g.entered)
		<-g.release
		return nil
	}
	if g.then != nil {
		return g.then(n)
	}
	return nil
}

// holdFirstWrite installs g at step o, starts first (a call that writes) and
// returns once that write is held at o.
func holdFirstWrite(t *testing.T, fsys *faultFS, o op, g *gate, first func()) {
	t.Helper()
	fsys.hook(o, g.hook)
	go first()
	select {
	case <-g.entered:
	case <-time.After(30 * time.Second):
		t.Fatalf("the first write never reached %s", o)
	}
}

// openFaulty opens a fresh checkpoint.json in dir, written through a
// faultFS, of boot A.
func openFaulty(t *testing.T, dir string) (string, *faultFS, *File) {
	t.Helper()
	path := filepath.Join(dir, "checkpoint.json")
	fsys := newFaultFS()
	f, _ := mustOpen(t, path, bootA, fsys)
	return path, fsys, f
}

// holdPut starts a Put of c on f and returns once its write is held at step
// o, with the gate holding it and the channel the Put's result comes on.
func holdPut(t *testing.T, fsys *faultFS, o op, f *File, c Claim) (*gate, <-chan error) {
	t.Helper()
	g := newGate()
	done := make(chan error, 1)
	holdFirstWrite(t, fsys, o, g, func() { done <- f.Put(c) })
	return g, done
}

// release lets the write g holds go on and checks that the held call
// (first) and the n calls queued behind it (errs) succeed.
func release(t *testing.T, g *gate, first, errs <-chan error, n int) {
	t.Helper()
	close(g.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// Concurrent Puts that arrive while a write is in progress are written
// together by the next write, and every one of them is on disk when its Put
// returns.
func TestGroupCommitConcurrentPutsAreAllDurable(t *testing.T) {
	path, fsys, f := openFaulty(t, t.TempDir())

	var renames atomic.Int32
	fsys.hook(opRename, func() error { renames.Add(1); return nil })
	g, firstDone := holdPut(t, fsys, opSync, f, testClaim("first", PrepareCompleted))

	const n = 100
	errs := make(chan error, n)
	onDiskAtReturn := make(chan map[types.UID]Claim, n)
	for i := range n {
		go func() {
			uid := fmt.Sprintf("c%03d", i)
			err := f.Put(testClaim(uid, PrepareCompleted))
			if err == nil {
				data, rerr := os.ReadFile(path)
				if rerr == nil {
					c, derr := decode(data)
					if derr == nil {
						onDiskAtReturn <- c.Claims
					}
				}
			}
			errs <- err
		}()
	}
	waitFor(t, "100 Puts queued behind the held write", func() bool { return f.queued() == n })
	release(t, g, firstDone, errs, n)
	close(onDiskAtReturn)
	for claims := range onDiskAtReturn {
		if len(claims) != n+1 {
			t.Errorf("a Put returned while the file held %d claims, want all %d of its batch", len(claims), n+1)
			break
		}
	}
	// One write for the held Put, one for the 100 queued behind it.
	if got := renames.Load(); got != 2 {
		t.Errorf("%d writes of the file for 101 Puts, want 2 (the held one and one batch)", got)
	}
	reopened, _ := mustOpen(t, path, bootA, osFS{})
	if got := len(reopened.List()); got != n+1 {
		t.Errorf("reopened store holds %d claims, want %d", got, n+1)
	}
	if diff := cmp.Diff(f.List(), reopened.List()); diff != "" {
		t.Errorf("memory and disk disagree (-memory +disk):\n%s", diff)
	}
}

// Changes of one batch are applied in the order of the calls: a Put, a
// Delete and a Put of the same claim queued behind a held write leave the
// last Put.
func TestGroupCommitKeepsOrder(t *testing.T) {
	path, fsys, f := openFaulty(t, t.TempDir())
	g, firstDone := holdPut(t, fsys, opSync, f, testClaim("x", PrepareStarted))

	steps := []func() error{
		func() error { return f.Put(testClaim("y", PrepareStarted)) },
		func() error { return f.Delete("y") },
		func() error { return f.Delete("x") },
		func() error { return f.Put(testClaim("y", PrepareCompleted)) },
	}
	errs := make(chan error, len(steps))
	for i, step := range steps {
		go func() { errs <- step() }()
		waitFor(t, fmt.Sprintf("change %d queued", i), func() bool { return f.queued() == i+1 })
	}
	release(t, g, firstDone, errs, len(steps))
	want := map[types.UID]ClaimState{"y": PrepareCompleted}
	for name, claims := range map[string]map[types.UID]Claim{"memory": toMap(f.List()), "disk": onDisk(t, path)} {
		got := map[types.UID]ClaimState{}
		for uid, c := range claims {
			got[uid] = c.State
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s after the batch (-want +got):\n%s", name, diff)
		}
	}
}

func toMap(claims []Claim) map[types.UID]Claim {
	m := map[types.UID]Claim{}
	for _, c := range claims {
		m[c.UID] = c
	}
	return m
}

// An fsync error fails every call of its batch, each naming its own claim;
// what earlier writes committed stays, in memory and on disk, and a Delete
// of a claim the store does not hold is not failed by the batch it rode in.
func TestGroupCommitFsyncErrorFailsTheWholeBatch(t *testing.T) {
	dir := t.TempDir()
	path, fsys, f := openFaulty(t, dir)
	if err := f.Put(testClaim("kept", PrepareCompleted)); err != nil {
		t.Fatal(err)
	}
	filesBefore := dirNames(t, dir)

	g := newGate()
	// The held write succeeds; the next one, the batch, fails its fsync.
	g.then = func(int32) error { return &os.PathError{Op: "sync", Path: "temp", Err: syscall.EIO} }
	firstDone := make(chan error, 1)
	holdFirstWrite(t, fsys, opSync, g, func() { firstDone <- f.Put(testClaim("first", PrepareCompleted)) })

	type call struct {
		name string
		do   func() error
	}
	calls := []call{
		{"put b", func() error { return f.Put(testClaim("b", PrepareStarted)) }},
		{"put c", func() error { return f.Put(testClaim("c", PrepareCompleted)) }},
		{"delete kept", func() error { return f.Delete("kept") }},
		{"delete unknown", func() error { return f.Delete("unknown") }},
	}
	errs := make([]chan error, len(calls))
	for i, c := range calls {
		errs[i] = make(chan error, 1)
		go func() { errs[i] <- c.do() }()
	}
	waitFor(t, "the batch queued", func() bool { return f.queued() == len(calls) })
	close(g.release)
	if err := <-firstDone; err != nil {
		t.Fatalf("the held write: %v", err)
	}
	for i, c := range calls {
		err := <-errs[i]
		if c.name == "delete unknown" {
			if err != nil {
				t.Errorf("%s: %v, want nil (it changes nothing)", c.name, err)
			}
			continue
		}
		if !errors.Is(err, syscall.EIO) || errors.Is(err, ErrNotDurable) {
			t.Errorf("%s: %v, want an error wrapping EIO and not ErrNotDurable", c.name, err)
			continue
		}
		uid := strings.Fields(c.name)[1]
		if !strings.Contains(err.Error(), "uid "+uid+")") || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: error %q does not name claim %s and %s", c.name, err, uid, path)
		}
	}
	want := []types.UID{"first", "kept"}
	if diff := cmp.Diff(want, uids(f.List())); diff != "" {
		t.Errorf("memory after the failed batch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(f.List(), sortedClaims(onDisk(t, path))); diff != "" {
		t.Errorf("memory and disk disagree (-memory +disk):\n%s", diff)
	}
	if diff := cmp.Diff(filesBefore, dirNames(t, dir)); diff != "" {
		t.Errorf("files (-before +after), temporary file left behind?\n%s", diff)
	}
	if changed, err := f.Refresh(); changed || err != nil {
		t.Errorf("Refresh after the failed batch = %v, %v; want false, nil", changed, err)
	}

	// The callers retry; the disk works again.
	fsys.hook(opSync, nil)
	if err := f.Put(testClaim("b", PrepareStarted)); err != nil {
		t.Fatal(err)
	}
	reopened, _ := mustOpen(t, path, bootA, osFS{})
	if diff := cmp.Diff([]types.UID{"b", "first", "kept"}, uids(reopened.List())); diff != "" {
		t.Errorf("reopened (-want +got):\n%s", diff)
	}
}

// A batch that fails at any step leaves the file holding either everything
// before the batch or (a failed directory sync, after the rename) the whole
// batch, never part of it; every call of the batch gets the error; a process
// that starts on the file then (after a crash) finds the same.
func TestGroupCommitFailureAtEveryStep(t *testing.T) {
	steps := []struct {
		op      op
		renamed bool
	}{
		{op: opCreate}, {op: opWrite}, {op: opSync}, {op: opClose}, {op: opRename},
		{op: opSyncDir, renamed: true},
	}
	for _, step := range steps {
		t.Run(string(step.op), func(t *testing.T) {
			dir := t.TempDir()
			path, fsys, f := openFaulty(t, dir)
			for _, uid := range []string{"a", "b"} {
				if err := f.Put(testClaim(uid, PrepareCompleted)); err != nil {
					t.Fatal(err)
				}
			}
			filesBefore := dirNames(t, dir)

			// The first write (it changes nothing) is held at its first
			// step while the batch queues; the second write, the batch's,
			// fails at step.
			failSecond := func(n int32) error {
				if n == 2 {
					return syscall.EIO
				}
				return nil
			}
			g := newGate()
			if step.op == opCreate {
				g.then = failSecond
			} else {
				var calls atomic.Int32
				fsys.hook(step.op, func() error { return failSecond(calls.Add(1)) })
			}
			firstDone := make(chan error, 1)
			holdFirstWrite(t, fsys, opCreate, g, func() { firstDone <- f.Put(testClaim("a", PrepareCompleted)) })
			calls := []func() error{
				func() error { return f.Put(testClaim("c", PrepareStarted)) },
				func() error { return f.Delete("a") },
				func() error { return f.Put(testClaim("b", PrepareStarted)) },
			}
			errs := make(chan error, len(calls))
			for _, call := range calls {
				go func() { errs <- call() }()
			}
			waitFor(t, "the batch queued", func() bool { return f.queued() == len(calls) })
			close(g.release)
			if err := <-firstDone; err != nil {
				t.Fatalf("held write: %v", err)
			}
			for range calls {
				err := <-errs
				if !errors.Is(err, syscall.EIO) {
					t.Errorf("a call of the batch returned %v, want an error wrapping EIO", err)
				}
				if errors.Is(err, ErrNotDurable) != step.renamed {
					t.Errorf("errors.Is(%v, ErrNotDurable) = %v, want %v", err, !step.renamed, step.renamed)
				}
			}
			want := map[types.UID]ClaimState{"a": PrepareCompleted, "b": PrepareCompleted}
			if step.renamed {
				want = map[types.UID]ClaimState{"b": PrepareStarted, "c": PrepareStarted}
			}
			restarted, _ := mustOpen(t, path, bootA, osFS{})
			for name, claims := range map[string][]Claim{"memory": f.List(), "disk": sortedClaims(onDisk(t, path)), "after a restart": restarted.List()} {
				got := map[types.UID]ClaimState{}
				for _, c := range claims {
					got[c.UID] = c.State
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("%s (-want +got):\n%s", name, diff)
				}
			}
			if diff := cmp.Diff(filesBefore, dirNames(t, dir)); diff != "" {
				t.Errorf("files (-before +after), temporary file left behind?\n%s", diff)
			}
			if changed, err := f.Refresh(); changed || err != nil {
				t.Errorf("Refresh after the failed batch = %v, %v; want false, nil", changed, err)
			}
		})
	}
}

// Refresh does not wait for a write in progress, and takes neither the
// content the write is replacing nor the content it is putting in place (a
// write held after its rename, before the directory sync) for another
// writer's.
func TestRefreshDoesNotWaitForAWrite(t *testing.T) {
	for _, o := range []op{opSync, opSyncDir} {
		t.Run(string(o), func(t *testing.T) {
			_, fsys, f := openFaulty(t, t.TempDir())
			g, done := holdPut(t, fsys, o, f, testClaim("a", PrepareCompleted))
			refreshed := make(chan error, 1)
			go func() {
				changed, err := f.Refresh()
				if err == nil && changed {
					err = errors.New("Refresh reported a change by another writer")
				}
				refreshed <- err
			}()
			select {
			case err := <-refreshed:
				if err != nil {
					t.Error(err)
				}
			case <-time.After(30 * time.Second):
				t.Error("Refresh waited for the write in progress")
			}
			close(g.release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if changed, err := f.Refresh(); changed || err != nil {
				t.Errorf("Refresh after the write = %v, %v; want false, nil", changed, err)
			}
		})
	}
}

// During a surge update two instances share the file. Each call takes the
// node lock (the kubelet plugin helper's, here a mutex), refreshes, then
// makes concurrent changes that commit in batches. No instance loses the
// other's claims.
func TestGroupCommitTwoInstances(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	fsys := newFaultFS()
	fsys.noSync = true // the point is the protocol, not the disk
	a, _ := mustOpen(t, path, bootA, fsys)
	b, _ := mustOpen(t, path, bootA, fsys)
	var nodeLock sync.Mutex
	call := func(f *File, prefix string, round int) error {
		nodeLock.Lock()
		defer nodeLock.Unlock()
		if _, err := f.Refresh(); err != nil {
			return err
		}
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := range 8 {
			wg.Go(func() {
				uid := types.UID(fmt.Sprintf("%s-%02d-%d", prefix, round, i))
				if err := f.Put(testClaim(string(uid), PrepareStarted)); err != nil {
					errs <- err
					return
				}
				if err := f.Put(testClaim(string(uid), PrepareCompleted)); err != nil {
					errs <- err
					return
				}
				if i%2 == 1 {
					errs <- f.Delete(uid)
				}
			})
		}
		wg.Wait()
		close(errs)
		var all []error
		for err := range errs {
			all = append(all, err)
		}
		return errors.Join(all...)
	}
	const rounds = 10
	var wg sync.WaitGroup
	for _, inst := range []struct {
		f      *File
		prefix string
	}{{a, "old"}, {b, "new"}} {
		wg.Go(func() {
			for r := range rounds {
				if err := call(inst.f, inst.prefix, r); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()

	var want []types.UID
	for _, prefix := range []string{"new", "old"} {
		for r := range rounds {
			for i := 0; i < 8; i += 2 {
				want = append(want, types.UID(fmt.Sprintf("%s-%02d-%d", prefix, r, i)))
			}
		}
	}
	slices.Sort(want)
	reader, _ := mustOpen(t, path, bootA, osFS{})
	if diff := cmp.Diff(want, uids(reader.List())); diff != "" {
		t.Fatalf("file after both instances (-want +got):\n%s", diff)
	}
	for name, f := range map[string]*File{"old": a, "new": b} {
		if _, err := f.Refresh(); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, uids(f.List())); diff != "" {
			t.Errorf("%s instance after Refresh (-want +got):\n%s", name, diff)
		}
	}
}

// A process that dies while a batch is being written leaves a file the next
// process opens as it was before the batch: the held write's temporary file
// is removed by that Open, and the dead process's write can no longer land.
func TestCrashDuringABatch(t *testing.T) {
	dir := t.TempDir()
	path, fsys, f := openFaulty(t, dir)
	if err := f.Put(testClaim("a", PrepareCompleted)); err != nil {
		t.Fatal(err)
	}
	g, done := holdPut(t, fsys, opSync, f, testClaim("b", PrepareStarted))

	// The restarted plugin opens the file while the write is still held.
	restarted, rec := mustOpen(t, path, bootA, osFS{})
	if rec.Kind != RecoveryNone {
		t.Errorf("recovery %s, want %s", rec.Kind, RecoveryNone)
	}
	if diff := cmp.Diff([]types.UID{"a"}, uids(restarted.List())); diff != "" {
		t.Errorf("restarted store (-want +got):\n%s", diff)
	}
	for _, name := range dirNames(t, dir) {
		if strings.HasPrefix(name, tempPrefix("checkpoint.json")) {
			t.Errorf("temporary file %s left after Open", name)
		}
	}
	close(g.release)
	if err := <-done; err == nil {
		t.Error("the dead process's write succeeded after its temporary file was removed")
	}
	if diff := cmp.Diff([]types.UID{"a"}, uids(sortedClaims(onDisk(t, path)))); diff != "" {
		t.Errorf("file after the dead process's write failed (-want +got):\n%s", diff)
	}
}

// The next batch is written while the previous one's directory sync is
// still running, and the previous batch's callers return only once their
// own directory sync is done.
func TestGroupCommitOverlapsTheDirectorySync(t *testing.T) {
	path, fsys, f := openFaulty(t, t.TempDir())
	g, first := holdPut(t, fsys, opSyncDir, f, testClaim("a", PrepareCompleted))

	// a is renamed into place but its directory sync is held: b's write
	// goes ahead and b returns, with a and b in the file.
	if err := f.Put(testClaim("b", PrepareCompleted)); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]types.UID{"a", "b"}, uids(sortedClaims(onDisk(t, path)))); diff != "" {
		t.Errorf("file while a's directory sync is held (-want +got):\n%s", diff)
	}
	select {
	case err := <-first:
		t.Fatalf("Put(a) returned (%v) before its directory sync was done", err)
	default:
	}
	close(g.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

// A batch whose directory sync fails returns ErrNotDurable to its callers
// only; a batch written after it is unaffected.
func TestGroupCommitDirectorySyncErrorIsTheBatchs(t *testing.T) {
	_, fsys, f := openFaulty(t, t.TempDir())
	g := newGate()
	first := make(chan error, 1)
	fsys.hook(opSyncDir, func() error {
		if g.calls.Load() == 0 {
			_ = g.hook() // the first directory sync is held, then fails
			return syscall.EIO
		}
		return g.hook()
	})
	go func() { first <- f.Put(testClaim("a", PrepareCompleted)) }()
	<-g.entered
	if err := f.Put(testClaim("b", PrepareCompleted)); err != nil {
		t.Fatalf("the batch after the one whose directory sync fails: %v", err)
	}
	close(g.release)
	if err := <-first; !errors.Is(err, ErrNotDurable) || !errors.Is(err, syscall.EIO) {
		t.Fatalf("Put(a) with a failing directory sync: %v, want ErrNotDurable wrapping EIO", err)
	}
	if diff := cmp.Diff([]types.UID{"a", "b"}, uids(f.List())); diff != "" {
		t.Errorf("memory (-want +got):\n%s", diff)
	}
	if changed, err := f.Refresh(); changed || err != nil {
		t.Errorf("Refresh = %v, %v; want false, nil", changed, err)
	}
}
