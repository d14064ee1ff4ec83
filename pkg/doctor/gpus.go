package doctor

import (
	"fmt"
	"strings"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

// checkGPUConditions reports what gpu.Conditions finds on the GPUs, as the
// kubelet plugin would publish them, one line per concern: "mig" (GPUs
// not published), "compute-mode" (GPUs published tainted because their
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
	if conds := byReason[gpu.ReasonMIGEnabled]; len(conds) > 0 {
		mig = Result{Check: "mig", Status: Warn,
			Message: fmt.Sprintf("%d of %d GPUs are in MIG mode and not published: %s", len(conds), len(gpus), indexes(conds)),
			Fix:     "Tessera does not hand out MIG instances yet. " + messages(conds)}
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
