package doctor

import (
	"fmt"
	"strings"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

// checkGPUConditions reports what gpu.Conditions finds on the GPUs, as the
// kubelet plugin would publish them, one line per concern: "mig" (GPUs in
// MIG mode, published as MIG devices; tainted while a MIG mode change waits
// for a reset or their MIG state is unknown), "compute-mode" (GPUs published tainted because their
// mode is not the expected one) and "nvlink-fabric" (GPUs tainted for an
// incomplete fabric registration, or in an NVLink domain of their own
// because NVML failed on their links).
func (c Config) checkGPUConditions(gpus []gpu.GPU, nvmlFailed bool) []Result {
	checks := []string{"mig", "compute-mode", "nvlink-fabric"}
	if nvmlFailed || len(gpus) == 0 {
		why := "skipped: no GPU to look at"
		if nvmlFailed {
			why = "skipped: no GPU to look at (NVML failed)"
		}
		out := make([]Result, 0, len(checks))
		for _, check := range checks {
			out = append(out, Result{Check: check, Status: Skip, Message: why})
		}
		return out
	}
	byReason := map[gpu.ConditionReason][]gpu.Condition{}
	for _, cond := range gpu.Conditions(gpus, c.ComputeModes) {
		byReason[cond.Reason] = append(byReason[cond.Reason], cond)
	}
	messages := func(conds ...[]gpu.Condition) string {
		var m []string
		for _, list := range conds {
			for _, cond := range list {
				m = append(m, cond.Message)
			}
		}
		return strings.Join(m, " ")
	}

	mig := Result{Check: "mig", Status: OK, Message: fmt.Sprintf("no GPU is in MIG mode (%d GPUs)", len(gpus))}
	enabled, pending, unknown := byReason[gpu.ReasonMIGEnabled], byReason[gpu.ReasonMIGModePending], byReason[gpu.ReasonMIGUnknown]
	switch {
	case len(pending) > 0 || len(unknown) > 0:
		var says []string
		if len(pending) > 0 {
			says = append(says, fmt.Sprintf("%d GPUs have a MIG mode change waiting for a GPU reset and are published tainted %s in their current mode: %s",
				len(pending), gpu.ReasonMIGModePending, indexes(pending)))
		}
		if len(unknown) > 0 {
			says = append(says, fmt.Sprintf("NVML failed on the MIG queries of %d GPUs, published tainted %s: %s", len(unknown), gpu.ReasonMIGUnknown, indexes(unknown)))
		}
		mig = Result{Check: "mig", Status: Warn, Message: strings.Join(says, "; "), Fix: messages(pending, unknown)}
	case len(enabled) > 0:
		mig.Message = fmt.Sprintf("%d of %d GPUs are in MIG mode and published as MIG devices only: %s", len(enabled), len(gpus), indexes(enabled))
	}

	expected := c.ComputeModes.Expected(gpu.GPU{})
	mode := Result{Check: "compute-mode", Status: OK, Message: fmt.Sprintf("every GPU is in the compute mode Tessera expects (%s)", expected)}
	if c.ComputeModes.PerGPU != nil || expected == gpu.ComputeModeAny {
		mode.Message = "every GPU is in the compute mode Tessera expects of it"
	}
	if conds := byReason[gpu.ReasonComputeMode]; len(conds) > 0 {
		mode = Result{Check: "compute-mode", Status: Warn,
			Message: fmt.Sprintf("%d of %d GPUs are not in the compute mode Tessera expects and are published tainted: %s", len(conds), len(gpus), indexes(conds)),
			Fix:     messages(conds)}
	}

	fabric := Result{Check: "nvlink-fabric", Status: OK, Message: "every GPU's NVLink links and fabric registration were read; none waits for the fabric"}
	notReady, unknown := byReason[gpu.ReasonFabricNotReady], byReason[gpu.ReasonNVLinkUnknown]
	switch {
	case len(notReady) > 0:
		fabric = Result{Check: "nvlink-fabric", Status: Warn,
			Message: fmt.Sprintf("%d GPUs have not completed their NVLink fabric registration (CUDA fails on them) and are published tainted: %s", len(notReady), indexes(notReady)),
			Fix:     messages(notReady, unknown)}
	case len(unknown) > 0:
		fabric = Result{Check: "nvlink-fabric", Status: Warn,
			Message: fmt.Sprintf("NVML failed on the NVLink or fabric queries of %d GPUs; each is published in an NVLink domain of its own: %s", len(unknown), indexes(unknown)),
			Fix:     messages(unknown)}
	}
	return []Result{mig, mode, fabric}
}

// indexes names the GPUs of conds: "GPU 3 (GPU-…), GPU 5 (GPU-…)".
func indexes(conds []gpu.Condition) string {
	names := make([]string, 0, len(conds))
	for _, c := range conds {
		names = append(names, fmt.Sprintf("GPU %d (%s)", c.Index, c.UUID))
	}
	return strings.Join(names, ", ")
}
