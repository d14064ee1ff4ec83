package doctor

import (
	"fmt"

	"github.com/BurntSushi/toml"
)

// ParseContainerdCDI reads the CDI settings (enable_cdi, cdi_spec_dirs) of
// the CRI plugin from a containerd config.toml: the table
// [plugins."io.containerd.cri.v1.runtime"] of a version 3 config
// (containerd 2.x), [plugins."io.containerd.grpc.v1.cri"] of older ones.
// Files named in imports are not read.
func ParseContainerdCDI(data []byte) (ContainerdCDI, error) {
	var raw struct {
		Version int                       `toml:"version"`
		Plugins map[string]map[string]any `toml:"plugins"`
	}
	if _, err := toml.Decode(string(data), &raw); err != nil {
		return ContainerdCDI{}, fmt.Errorf("not a containerd config: %w", err)
	}
	out := ContainerdCDI{Version: raw.Version}
	sections := []string{criSectionV2, criSectionV3}
	if raw.Version >= 3 {
		sections = []string{criSectionV3, criSectionV2}
	}
	for _, name := range sections {
		table, ok := raw.Plugins[name]
		if !ok {
			continue
		}
		if out.Section == "" {
			out.Section = name
		}
		if v, ok := table["enable_cdi"]; ok && out.EnableCDI == nil {
			b, ok := v.(bool)
			if !ok {
				return out, fmt.Errorf("plugins.%q.enable_cdi = %v: want true or false", name, v)
			}
			out.EnableCDI, out.Section = &b, name
		}
		if v, ok := table["cdi_spec_dirs"]; ok && out.SpecDirs == nil {
			list, ok := v.([]any)
			if !ok {
				return out, fmt.Errorf("plugins.%q.cdi_spec_dirs = %v: want a list of directories", name, v)
			}
			out.SpecDirs = []string{}
			for i, d := range list {
				s, ok := d.(string)
				if !ok {
					return out, fmt.Errorf("plugins.%q.cdi_spec_dirs[%d] = %v: want a directory", name, i, d)
				}
				out.SpecDirs = append(out.SpecDirs, s)
			}
		}
	}
	return out, nil
}
