// Command imagebuild builds a single-layer container image from host files and
// pushes it to a registry, without Docker or a base image. The local cluster uses
// it for the pause image, a busybox image and the kubelet plugin image.
//
//	imagebuild --ref 127.0.0.1:5000/pause:3.10 --file ./pause:/pause --entrypoint /pause
//	imagebuild --ref 127.0.0.1:5000/tessera/plugin:dev --with-libs \
//	    --file ./tessera-kubelet-plugin:/usr/bin/tessera-kubelet-plugin \
//	    --entrypoint /usr/bin/tessera-kubelet-plugin
//
// --with-libs adds what `ldd` lists for every --file (the dynamic loader and libc
// of a cgo binary), at the same paths, so a dynamically linked binary runs in an
// image that has nothing else. A registry on loopback is spoken to over plain http.
package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

// entry is one thing in the layer: a regular file copied from src, a symlink or a
// directory.
type entry struct {
	dst    string
	src    string // regular file
	target string // symlink
	dir    bool
	mode   int64
}

func main() {
	var (
		ref, platform string
		files, links  multi
		libs, env     multi
		args          multi
		entrypoint    string
		withLibs      bool
	)
	flag.StringVar(&ref, "ref", "", "image reference to push, e.g. 127.0.0.1:5000/pause:3.10 (required)")
	flag.Var(&files, "file", "SRC:DST, a host file and its absolute path in the image (repeatable)")
	flag.Var(&links, "symlink", "DST:TARGET, a symlink in the image (repeatable)")
	flag.Var(&libs, "lib", "host path of a shared library to copy to the same path (repeatable)")
	flag.BoolVar(&withLibs, "with-libs", false, "add the libraries `ldd` lists for each --file")
	flag.StringVar(&entrypoint, "entrypoint", "", "entrypoint path in the image")
	flag.Var(&args, "arg", "default argument (image Cmd), repeatable")
	flag.Var(&env, "env", "KEY=VALUE in the image config (repeatable)")
	flag.StringVar(&platform, "platform", "linux/amd64", "OS/ARCH of the image")
	flag.Parse()
	if err := run(ref, platform, files, links, libs, env, args, entrypoint, withLibs); err != nil {
		fmt.Fprintln(os.Stderr, "imagebuild:", err)
		os.Exit(1)
	}
}

func run(ref, platform string, files, links, libs, env, args []string, entrypoint string, withLibs bool) error {
	if ref == "" {
		return errors.New("--ref is required")
	}
	osName, arch, ok := strings.Cut(platform, "/")
	if !ok {
		return fmt.Errorf("--platform %q: want OS/ARCH", platform)
	}
	tag, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return fmt.Errorf("--ref %q: %w", ref, err)
	}

	entries := map[string]entry{"/tmp": {dst: "/tmp", dir: true, mode: 0o1777}}
	add := func(e entry) error {
		if !path.IsAbs(e.dst) {
			return fmt.Errorf("%q: paths in the image must be absolute", e.dst)
		}
		e.dst = path.Clean(e.dst)
		entries[e.dst] = e
		for d := path.Dir(e.dst); d != "/"; d = path.Dir(d) {
			if _, ok := entries[d]; !ok {
				entries[d] = entry{dst: d, dir: true, mode: 0o755}
			}
		}
		return nil
	}
	for _, f := range files {
		src, dst, ok := strings.Cut(f, ":")
		if !ok {
			return fmt.Errorf("--file %q: want SRC:DST", f)
		}
		fi, err := os.Stat(src)
		if err != nil {
			return fmt.Errorf("--file %q: %w", f, err)
		}
		if err := add(entry{dst: dst, src: src, mode: int64(fi.Mode().Perm())}); err != nil {
			return err
		}
		if withLibs {
			found, err := lddLibs(src)
			if err != nil {
				return err
			}
			libs = append(libs, found...)
		}
	}
	for _, l := range libs {
		fi, err := os.Stat(l) // follows symlinks: the image gets the file's content
		if err != nil {
			return fmt.Errorf("--lib %q: %w", l, err)
		}
		if err := add(entry{dst: l, src: l, mode: int64(fi.Mode().Perm())}); err != nil {
			return err
		}
	}
	for _, s := range links {
		dst, target, ok := strings.Cut(s, ":")
		if !ok {
			return fmt.Errorf("--symlink %q: want DST:TARGET", s)
		}
		if err := add(entry{dst: dst, target: target}); err != nil {
			return err
		}
	}

	layerTar, err := writeTar(entries)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return fmt.Errorf("append layer: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = osName, arch
	cfg.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cfg.Config.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}, env...)
	if entrypoint != "" {
		cfg.Config.Entrypoint = []string{entrypoint}
	}
	cfg.Config.Cmd = args
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := remote.Write(tag, img, remote.WithContext(ctx)); err != nil {
		return fmt.Errorf("push %s: %w", tag, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s@%s\n", tag.Name(), digest)
	return nil
}

// writeTar writes entries sorted by path, so parents come before children and the
// same inputs give the same layer digest.
func writeTar(entries map[string]entry) ([]byte, error) {
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := entries[n]
		h := &tar.Header{Name: strings.TrimPrefix(n, "/"), Mode: e.mode, Format: tar.FormatPAX}
		switch {
		case e.dir:
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case e.target != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, e.target, 0o777
		default:
			data, err := os.ReadFile(e.src)
			if err != nil {
				return nil, err
			}
			h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
			if err := tw.WriteHeader(h); err != nil {
				return nil, err
			}
			if _, err := tw.Write(data); err != nil {
				return nil, err
			}
			continue
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// lddLibs returns the absolute library paths `ldd` lists for bin, the dynamic
// loader included; none for a static binary.
func lddLibs(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).CombinedOutput()
	if err != nil {
		// ldd exits non-zero for static binaries.
		if strings.Contains(string(out), "not a dynamic executable") ||
			strings.Contains(string(out), "statically linked") {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %w: %s", bin, err, out)
	}
	return parseLdd(string(out)), nil
}

// parseLdd reads lines such as
//
//	linux-vdso.so.1 (0x...)
//	libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)
//	/lib64/ld-linux-x86-64.so.2 (0x...)
func parseLdd(out string) []string {
	var libs []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if _, after, ok := strings.Cut(line, "=>"); ok {
			line = strings.TrimSpace(after)
		}
		p, _, _ := strings.Cut(line, " ")
		if path.IsAbs(p) {
			libs = append(libs, p)
		}
	}
	return libs
}
