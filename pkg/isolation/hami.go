package isolation

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// Container paths of the HAMiCore backend.
const (
	// HAMiCoreContainerSharedDir is where a HAMiCore container finds its
	// claim's own directory: HAMi-core's shared region (the usage of every
	// process of the claim, in all its containers, counted against one
	// limit) and its lock file. HAMi-core takes the lock at
	// /tmp/vgpulock/lock (releases before 2026-02 use it to serialize the
	// host-PID detection of a new context), so the directory is mounted
	// there and the region file named inside it.
	HAMiCoreContainerSharedDir = "/tmp/vgpulock"
	// HAMiCoreContainerSharedRegion is the value of
	// CUDA_DEVICE_MEMORY_SHARED_CACHE: HAMi-core's shared region file.
	HAMiCoreContainerSharedRegion = HAMiCoreContainerSharedDir + "/cudevshr.cache"
)

// DefaultHAMiCoreClaimRoot is the kubelet plugin's default
// [HAMiCore.ClaimRoot]: on /run, a tmpfs on systemd hosts.
const DefaultHAMiCoreClaimRoot = "/var/run/tessera/hami-claims"

// HAMiCore is the node's installation of HAMi-core, the library that enforces
// a share's memory and SM limits by intercepting the CUDA driver API.
type HAMiCore struct {
	// Library is the host path of libvgpu.so (flag --hami-core-library);
	// the chart's hamiCore.image installs it there.
	Library string
	// PreloadFile is the host path of the ld.so.preload file mounted into
	// containers; [WritePreloadFile] creates it.
	PreloadFile string
	// ClaimRoot is the host directory that holds one directory per prepared
	// HAMiCore claim ([HAMiCore.ClaimDir]), mounted read-write into the
	// claim's containers only: two claims never share HAMi-core's region.
	// The regions are per boot and written on every CUDA allocation, so a
	// tmpfs suits them (the kubelet plugin's default is under /var/run).
	ClaimRoot string
	// OldClaimRoots are claim roots of earlier releases: claims prepared
	// there keep their directory, and unprepare removes it from there too.
	OldClaimRoots []string
	// Mounter, when set, gives each claim's directory under ClaimRoot a
	// tmpfs of its own of ClaimDirSize bytes (nosuid, nodev, noexec), so
	// that the claim's containers, which write it, cannot fill the file
	// system under ClaimRoot (the host's /run, which the kubelet and the
	// container runtime need). [HostShm] on real nodes, where the plugin
	// is privileged and its ClaimRoot propagates to the host; nil: plain
	// directories.
	Mounter ShmMounter
	// ClaimDirSize bounds each claim's tmpfs; zero:
	// DefaultHAMiCoreClaimDirSize.
	ClaimDirSize int64
}

// DefaultHAMiCoreClaimDirSize bounds one claim's HAMi-core directory:
// HAMi-core's shared region (a fixed-size file with a slot per process,
// a few MiB) and its lock file, with room to spare.
const DefaultHAMiCoreClaimDirSize = 16 << 20

func (h HAMiCore) claimDirSize() int64 {
	if h.ClaimDirSize <= 0 {
		return DefaultHAMiCoreClaimDirSize
	}
	return h.ClaimDirSize
}

// Check fails closed: it returns an error naming the path and the flag unless
// the library and the preload file are regular files and there is a claim
// root. A share that asks for HAMiCore must not run unlimited because the
// library is missing.
func (h HAMiCore) Check() error {
	if h.Library == "" {
		return errors.New("isolation HAMiCore: HAMi-core is not configured on this node (--hami-core-library is empty)")
	}
	if err := regularFile(h.Library); err != nil {
		return fmt.Errorf("isolation HAMiCore: library %s (--hami-core-library): %w; refusing to run the share without limits", h.Library, err)
	}
	if h.PreloadFile == "" {
		return errors.New("isolation HAMiCore: no ld.so.preload file was written")
	}
	if err := regularFile(h.PreloadFile); err != nil {
		return fmt.Errorf("isolation HAMiCore: preload file %s: %w", h.PreloadFile, err)
	}
	if h.ClaimRoot == "" {
		return errors.New("isolation HAMiCore: no directory for the claims' shared regions")
	}
	return nil
}

// ClaimDir is the host directory of the claim's HAMi-core shared region. It
// depends only on the claim's UID and the claim roots, so a spec rebuilt from
// a claim's record names the same directory while the roots stay.
// A claim prepared by a release with another claim root keeps its directory
// there (one of OldClaimRoots, when it exists), so that its containers keep
// sharing one region after an upgrade.
func (h HAMiCore) ClaimDir(claimUID types.UID) string {
	if h.ClaimRoot == "" || claimUID == "" {
		return ""
	}
	if namesDir(claimUID) {
		for _, root := range h.OldClaimRoots {
			if old := filepath.Join(root, string(claimUID)); root != "" && isDir(old) {
				return old
			}
		}
	}
	return filepath.Join(h.ClaimRoot, string(claimUID))
}

// namesDir reports whether a claim UID can be a directory's name.
func namesDir(claimUID types.UID) bool {
	return claimUID != "" && !strings.ContainsAny(string(claimUID), "/\x00") && claimUID != "." && claimUID != ".."
}

// claimUIDPattern matches the UIDs the API server gives objects.
var claimUIDPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// RememberClaimRoots adds root to the list of claim roots kept in the file
// at path (one per line; created if missing) and returns the others: the
// roots this node's plugin used before, under which claims prepared then
// keep their directories ([HAMiCore.OldClaimRoots]) after --hami-claim-root
// changes.
func RememberClaimRoots(path, root string) ([]string, error) {
	var roots []string
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("isolation HAMiCore: read the claim roots used before: %w", err)
	}
	for line := range strings.Lines(string(data)) {
		if r := strings.TrimSpace(line); filepath.IsAbs(r) && !slices.Contains(roots, r) {
			roots = append(roots, r)
		}
	}
	var others []string
	for _, r := range roots {
		if r != root {
			others = append(others, r)
		}
	}
	if slices.Contains(roots, root) {
		return others, nil
	}
	roots = append(roots, root)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strings.Join(roots, "\n")+"\n"), 0o600); err != nil {
		return others, fmt.Errorf("isolation HAMiCore: record claim root %s: %w", root, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return others, fmt.Errorf("isolation HAMiCore: record claim root %s: %w", root, err)
	}
	return others, nil
}

func isDir(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.IsDir()
}

// EnsureClaimRoot creates ClaimRoot and makes it root's only (mode 0700,
// whatever made it before, such as the kubelet's DirectoryOrCreate with
// 0755): the claims' regions are HAMi-core's accounting, which no host user
// and no pod that mounts /run may reach. The container runtime (root) still
// resolves each claim's directory, and a container sees only its own.
func (h HAMiCore) EnsureClaimRoot() error {
	if h.ClaimRoot == "" {
		return errors.New("isolation HAMiCore: no directory for the claims' shared regions")
	}
	if err := os.MkdirAll(h.ClaimRoot, 0o700); err != nil {
		return fmt.Errorf("isolation HAMiCore: create %s: %w", h.ClaimRoot, err)
	}
	entries, err := os.ReadDir(h.ClaimRoot)
	if err != nil {
		return fmt.Errorf("isolation HAMiCore: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() || !claimUIDPattern.MatchString(e.Name()) {
			return fmt.Errorf("isolation HAMiCore: %s holds %q, which is no claim's directory: give the claims' shared regions a directory of their own (--hami-claim-root); its mode was left as it is", h.ClaimRoot, e.Name())
		}
	}
	if err := os.Chmod(h.ClaimRoot, 0o700); err != nil {
		return fmt.Errorf("isolation HAMiCore: chmod %s: %w", h.ClaimRoot, err)
	}
	return nil
}

// CreateClaimDir creates the claim's directory (idempotent). It is world
// writable (mode 1777, like /tmp) because the container's processes, of any
// user, create the region file in it; only the claim's containers mount it.
//
// With a Mounter, a directory under ClaimRoot is a size-bounded tmpfs of its
// own, mounted here before any spec names it; a call after a plugin restart
// or a reboot (the kubelet's retry, or the rebuild of a prepared claim's
// spec) mounts it again if it is not. One that exists unmounted and holds
// files is left as it is: a claim prepared by a release without the tmpfs,
// whose containers share the region in it, which a tmpfs over it would hide
// from the claim's next containers.
func (h HAMiCore) CreateClaimDir(claimUID types.UID) error {
	dir := h.ClaimDir(claimUID)
	if dir == "" {
		return errors.New("isolation HAMiCore: no directory for the claim's shared region")
	}
	if !namesDir(claimUID) {
		return fmt.Errorf("isolation HAMiCore: claim UID %q cannot name a directory", claimUID)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return fmt.Errorf("isolation HAMiCore: create %s: %w", filepath.Dir(dir), err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("isolation HAMiCore: create %s: %w", dir, err)
	}
	if !isDir(dir) {
		return fmt.Errorf("isolation HAMiCore: %s exists and is not a directory", dir)
	}
	if h.Mounter != nil && filepath.Dir(dir) == filepath.Clean(h.ClaimRoot) {
		mounted, err := isMountPoint(dir)
		if err != nil {
			return fmt.Errorf("isolation HAMiCore: %w", err)
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("isolation HAMiCore: %w", err)
		}
		if !mounted && len(entries) == 0 {
			if err := h.Mounter.Mount(dir, h.claimDirSize()); err != nil {
				return fmt.Errorf("isolation HAMiCore: the claim's directory: %w", err)
			}
		}
	}
	if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
		return fmt.Errorf("isolation HAMiCore: chmod %s: %w", dir, err)
	}
	return nil
}

// RemoveClaimDir removes the claim's directory and what HAMi-core left in it,
// under ClaimRoot and every one of OldClaimRoots, unmounting its tmpfs first
// (with a Mounter). A missing directory, or no claim root, is not an error;
// a tmpfs that cannot be unmounted is, and the directory is kept for the
// next try.
func (h HAMiCore) RemoveClaimDir(claimUID types.UID) error {
	if !namesDir(claimUID) {
		return nil
	}
	var errs []error
	for _, root := range append([]string{h.ClaimRoot}, h.OldClaimRoots...) {
		if root == "" {
			continue
		}
		dir := filepath.Join(root, string(claimUID))
		if h.Mounter != nil {
			// The tmpfs first: what is in it goes with it, and the
			// directory under it can then be removed.
			if err := h.Mounter.Unmount(dir); err != nil {
				errs = append(errs, fmt.Errorf("isolation HAMiCore: %w", err))
				continue
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("isolation HAMiCore: remove %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}

// hamiCoreEdits are the HAMiCore edits of the claim's one share g, whose
// shared region is in the host directory claimDir ([HAMiCore.ClaimDir]):
//
//	CUDA_DEVICE_MEMORY_LIMIT_0=<MiB>m   HAMi-core's limit of device 0
//	CUDA_DEVICE_SM_LIMIT_0=<percent>    its SM utilization limit of device 0
//	CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/vgpulock/cudevshr.cache
//	libvgpu.so  → /usr/local/vgpu/libvgpu.so (read-only, the file only)
//	ld.so.preload → /etc/ld.so.preload        (read-only, the file only)
//	claimDir    → /tmp/vgpulock               (read-write)
//
// HAMi-core keeps its limits in arrays indexed by the device's index as
// CUDA_VISIBLE_DEVICES maps it (utils.c parse_cuda_visible_env; a UUID
// entry maps to 0) and reads CUDA_DEVICE_*_LIMIT_<i> for index i before the
// unsuffixed variable, which is its fallback for every device. The claim's
// device sets CUDA_VISIBLE_DEVICES to the share's GPU, so the share is index
// 0. Its memory parser takes a number with a k, m or g suffix (KiB, MiB,
// GiB); limits are whole MiB, rounded down. Only files are mounted, never a
// directory of the image's library path, so the image's own libc stays
// visible.
//
// The shared region has a slot per process, keyed by getpid() in the
// process's own PID namespace: two containers of a pod without
// shareProcessNamespace, or two pods, that use the claim can have processes
// with the same PID that overwrite each other's slot, so the claim's usage
// is undercounted and its limit does not hold. The webhook warns about a
// HAMiCore ResourceClaim; docs/ARCHITECTURE.md says what to do.
func hamiCoreEdits(g GPU, h HAMiCore, claimDir string) (cdispec.ContainerEdits, error) {
	if h.Library == "" || h.PreloadFile == "" {
		return cdispec.ContainerEdits{}, errors.New("isolation HAMiCore: HAMi-core is not configured on this node (--hami-core-library is empty)")
	}
	if claimDir == "" {
		return cdispec.ContainerEdits{}, errors.New("isolation HAMiCore: no directory for the claim's shared region")
	}
	mib := g.MemoryLimit >> 20
	if mib < 1 {
		return cdispec.ContainerEdits{}, fmt.Errorf("isolation HAMiCore: share on GPU %s: memory limit %d bytes is less than 1 MiB", g.UUID, g.MemoryLimit)
	}
	return cdispec.ContainerEdits{
		Env: []string{
			"CUDA_DEVICE_MEMORY_LIMIT_0=" + itoa(mib) + "m",
			"CUDA_DEVICE_SM_LIMIT_0=" + itoa(g.CoresLimit),
			"CUDA_DEVICE_MEMORY_SHARED_CACHE=" + HAMiCoreContainerSharedRegion,
		},
		Mounts: []*cdispec.Mount{
			bindMount(h.Library, HAMiCoreContainerLibrary, "ro"),
			bindMount(h.PreloadFile, PreloadContainerFile, "ro"),
			bindMount(claimDir, HAMiCoreContainerSharedDir, "rw"),
		},
	}, nil
}

func regularFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return errors.New("not found")
		}
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("not a regular file (mode %s)", fi.Mode())
	}
	return nil
}

// WritePreloadFile writes dir/ld.so.preload naming [HAMiCoreContainerLibrary]
// (creating dir) and returns its path. It is rewritten at every start, so a
// file from an older release is replaced.
func WritePreloadFile(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("isolation HAMiCore: create %s: %w", dir, err)
	}
	path := filepath.Join(dir, "ld.so.preload")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(HAMiCoreContainerLibrary+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("isolation HAMiCore: write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("isolation HAMiCore: write %s: %w", path, err)
	}
	return path, nil
}
