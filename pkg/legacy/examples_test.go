package legacy

import (
	"os"
	"path/filepath"
)

// The pods of each system's documentation, as the documentation writes them
// (only the kind of the gpushare StatefulSet is changed to a Pod's template;
// Koordinator's proposals show the resources block alone, put in a pod here).
// They are kept in testdata/examples byte for byte.
var (
	// HAMi, examples/nvidia/default_use.yaml @4707fb02.
	hamiDefaultUse = example("hami-default-use.yaml")
	// HAMi, examples/nvidia/use_memory_fraction.yaml.
	hamiMemoryFraction = example("hami-memory-fraction.yaml")
	// HAMi, examples/nvidia/use_exclusive_card.yaml.
	hamiExclusive = example("hami-exclusive.yaml")
	// HAMi, examples/nvidia/specify_card_type_to_use.yaml.
	hamiUseType = example("hami-use-type.yaml")
	// HAMi, examples/nvidia/specify_card_type_not_use.yaml.
	hamiNoUseType = example("hami-no-use-type.yaml")
	// gpushare-scheduler-extender, docs/userguide.md (the StatefulSet's
	// template) @c0b61411.
	gpushareUserGuide = example("gpushare-user-guide.yaml")
	// Koordinator, 20220629-fine-grained-device-scheduling.md, "Apply
	// koordinator.sh/gpu-core and koordinator.sh/gpu-memory-ratio separately".
	koordCoreRatio = example("koord-core-ratio.yaml")
	// Koordinator, the same document, "Apply koordinator.sh/gpu-core and
	// koordinator.sh/gpu-memory separately".
	koordCoreMemory = example("koord-core-memory.yaml")
	// Koordinator, the same document, "Apply whole resources of GPU or part
	// resources of GPU" (koordinator.sh/gpu: 50), and two whole GPUs as
	// gpu-core and gpu-memory-ratio 200 (its "translates nvidia.com/gpu: 2").
	koordShorthand = example("koord-shorthand.yaml")
	// NVIDIA's device plugin, README ("Running GPU Jobs").
	devicePlugin = example("device-plugin.yaml")
)

// example is testdata/examples/name.
func example(name string) string {
	b, err := os.ReadFile(filepath.Join("testdata", "examples", name))
	if err != nil {
		panic(err)
	}
	return string(b)
}
