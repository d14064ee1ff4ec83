package isolation

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// HAMiCore is the node's installation of HAMi-core, the library that enforces
// a share's memory and SM limits by intercepting the CUDA driver API.
type HAMiCore struct {
	// Library is the host path of libvgpu.so (flag --hami-core-library).
	Library string
	// PreloadFile is the host path of the ld.so.preload file mounted into
	// containers; [WritePreloadFile] creates it.
	PreloadFile string
}

// Check fails closed: it returns an error naming the path and the flag unless
// the library and the preload file are regular files. A share that asks for
// HAMiCore must not run unlimited because the library is missing.
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
	return nil
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
