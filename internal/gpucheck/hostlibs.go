package gpucheck

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The GPU machine has no NVIDIA container toolkit, which is what puts the
// driver's libraries into a container on a node. The container check mounts
// them itself: the libraries the probe links (glibc: the bundle's root
// filesystem is busybox only), the driver's user-space libraries CUDA needs
// (libcuda and what it loads), and what a preloaded library (HAMi-core's)
// links, each at /tessera/lib/<soname>, with LD_LIBRARY_PATH pointing
// there; the dynamic loader at the path the probe names (PT_INTERP).

// containerLibDir is where the libraries are mounted in the container.
const containerLibDir = "/tessera/lib"

// driverLibraries are the driver's user-space libraries a CUDA process
// loads: libcuda (the driver API), NVML, the PTX JIT compiler libcuda
// dlopens for PTX (the probe's kernel is PTX) and, where the driver has
// them, NVVM and the JIT's GPU compiler. The NVIDIA container toolkit's
// "compute" driver capability mounts these among others (assumed from its
// documentation of driver capabilities, not checked against its source).
var driverLibraries = []string{"libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1", "libnvidia-nvvm.so.4", "libnvidia-gpucomp.so.*"}

// hostLib is one library to mount: the name the loader looks for and the
// file on the host.
type hostLib struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// containerLibs is what the container needs of the host's libraries.
type containerLibs struct {
	// Interp is the dynamic loader's path (the probe's PT_INTERP); it is
	// mounted there.
	Interp     string
	InterpHost string
	Libs       []hostLib
	// DriverDir is where the driver's libraries were found ("" in a mock
	// run).
	DriverDir string
	// Missing are libraries that were looked for and not found (the
	// container may still run without one of the driver's optional
	// libraries).
	Missing []string
	// MissingPreload are what a preloaded library (HAMi-core's libvgpu.so)
	// needs and the host lacks: the loader would refuse the preload, so
	// the container would run without it.
	MissingPreload []string
}

// findContainerLibs resolves what the probe binary self needs, and with
// driver the driver's libraries (found next to the NVML library this
// process loaded, else through the loader's search), and what the
// libraries in preload link.
func findContainerLibs(self string, driver bool, preload []string) (containerLibs, error) {
	var out containerLibs
	f, err := elf.Open(self)
	if err != nil {
		return out, fmt.Errorf("read the probe %s: %w", self, err)
	}
	class, machine := f.Class, f.Machine
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			data := make([]byte, p.Filesz)
			if _, err := p.ReadAt(data, 0); err == nil {
				out.Interp = strings.TrimRight(string(data), "\x00")
			}
		}
	}
	needed, _ := f.ImportedLibraries()
	_ = f.Close()
	if out.Interp == "" {
		return out, fmt.Errorf("the probe %s names no dynamic loader (PT_INTERP): it is linked statically and cannot dlopen the driver", self)
	}
	if out.InterpHost, err = filepath.EvalSymlinks(out.Interp); err != nil {
		return out, fmt.Errorf("the probe's dynamic loader %s: %w", out.Interp, err)
	}

	r := libResolver{class: class, machine: machine, seen: map[string]bool{}}
	if driver {
		out.DriverDir = nvmlLibraryDir()
		r.dirs = append(r.dirs, out.DriverDir)
	}
	r.dirs = append(r.dirs, filepath.SplitList(os.Getenv("LD_LIBRARY_PATH"))...)
	r.dirs = append(r.dirs, "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
		"/lib64", "/usr/lib64", "/lib", "/usr/lib", "/usr/local/nvidia/lib64", "/run/nvidia/driver/usr/lib/x86_64-linux-gnu",
		"/run/nvidia/driver/usr/lib64", "/usr/lib/wsl/lib")
	r.cache = ldconfigCache()
	for _, n := range needed {
		r.add(n, true)
	}
	if driver {
		for _, name := range driverLibraries {
			r.add(name, name == "libcuda.so.1" || name == "libnvidia-ml.so.1")
		}
	}
	before := len(r.missing)
	for _, lib := range preload {
		if ef, err := elf.Open(lib); err == nil {
			deps, _ := ef.ImportedLibraries()
			_ = ef.Close()
			for _, d := range deps {
				r.add(d, true)
			}
		}
	}
	out.Libs, out.Missing = r.libs, r.missing
	out.MissingPreload = slices.Clone(r.missing[before:])
	if driver && !slices.ContainsFunc(out.Libs, func(l hostLib) bool { return l.Name == "libcuda.so.1" }) {
		return out, fmt.Errorf("the driver's libcuda.so.1 was not found (looked in %s and ldconfig's cache)", strings.Join(r.dirs, ", "))
	}
	return out, nil
}

// libResolver finds libraries by soname as the dynamic loader would, and
// what they need in turn.
type libResolver struct {
	class   elf.Class
	machine elf.Machine
	dirs    []string
	cache   map[string]string // soname → path, from ldconfig -p
	seen    map[string]bool
	libs    []hostLib
	missing []string
}

// add resolves name (a soname, or a glob of one) and its dependencies;
// required says a miss is worth reporting.
func (r *libResolver) add(name string, required bool) {
	if r.seen[name] {
		return
	}
	r.seen[name] = true
	var paths []string
	for _, d := range r.dirs {
		if d == "" {
			continue
		}
		matches, _ := filepath.Glob(filepath.Join(d, name))
		for _, m := range matches {
			if r.fits(m) {
				paths = append(paths, m)
			}
		}
		if len(paths) > 0 {
			break
		}
	}
	if len(paths) == 0 {
		if p, ok := r.cache[name]; ok && r.fits(p) {
			paths = append(paths, p)
		}
	}
	if len(paths) == 0 {
		if required {
			r.missing = append(r.missing, name)
		}
		return
	}
	for _, p := range paths {
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			continue
		}
		soname := filepath.Base(p)
		r.seen[soname] = true
		r.libs = append(r.libs, hostLib{Name: soname, Path: real})
		if ef, err := elf.Open(real); err == nil {
			deps, _ := ef.ImportedLibraries()
			_ = ef.Close()
			for _, d := range deps {
				r.add(d, true)
			}
		}
	}
}

// fits reports whether path is a shared library of the probe's class and
// machine (a 32-bit copy in /usr/lib is not).
func (r *libResolver) fits(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	return f.Class == r.class && f.Machine == r.machine
}

// nvmlLibraryDir is the directory of the NVML library this process has
// loaded (go-nvml dlopens it): the driver's library directory, wherever the
// driver is installed. Empty when none is loaded.
func nvmlLibraryDir() string {
	data, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return ""
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 6 && strings.Contains(filepath.Base(fields[5]), "libnvidia-ml.so") {
			return filepath.Dir(fields[5])
		}
	}
	return ""
}

// ldconfigCache is ldconfig -p's soname → path map (empty without
// ldconfig).
func ldconfigCache() map[string]string {
	out := map[string]string{}
	bin, err := exec.LookPath("ldconfig")
	if err != nil {
		if _, serr := os.Stat("/sbin/ldconfig"); serr != nil {
			return out
		}
		bin = "/sbin/ldconfig"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	data, err := exec.CommandContext(ctx, bin, "-p").Output()
	if err != nil {
		return out
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), " ")
		_, path, found := strings.Cut(rest, "=> ")
		if ok && found {
			if _, dup := out[name]; !dup {
				out[name] = strings.TrimSpace(path)
			}
		}
	}
	return out
}
