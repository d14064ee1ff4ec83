package checkpoint

import (
	"fmt"
	"os"
	"strings"
)

// bootIDPath is where Linux publishes a random id that changes on every boot.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// BootID returns the current boot id of the node (the trimmed content of
// /proc/sys/kernel/random/boot_id). Pass it to [Open].
func BootID() (string, error) {
	return readBootID(bootIDPath)
}

func readBootID(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read boot id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if id == "" {
		return "", fmt.Errorf("read boot id: %s is empty", path)
	}
	return id, nil
}
