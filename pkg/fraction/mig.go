package fraction

import (
	"errors"
	"fmt"
	"math/big"
	"regexp"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// A fraction of a MIG class is not a share: MIG devices are whole GPU
// instances of fixed profiles. For each GPU model whose MIG profile table
// Tessera knows, a fraction f becomes the smallest profile whose compute AND
// memory both cover f of the GPU: compute slices / the GPU's compute slices
// >= f, and memory slices / the GPU's memory slices >= f. On an H100 80GB
// (7 compute, 8 memory slices) 1/7 is 1g.20gb (1 of 7 compute, 2 of 8
// memory: 1g.10gb has 1 of 8 memory slices, less than 1/7), 1/8 is 1g.10gb,
// 1/4 is 2g.20gb, 1/3 is 3g.40gb, 1/2 is 4g.40gb and 1 is 7g.80gb.

// MIG names that MIG fractions depend on (a test keeps attrProfile equal to
// pkg/model's).
const (
	migClassName       = modelnames.MIGClassName
	attrProfile        = resourceapi.QualifiedName("profile")
	migProfileMaxChars = resourceapi.DeviceAttributeMaxValueLength
)

// MIGClassName is the DeviceClass of MIG devices (pkg/model.MIGClassName).
const MIGClassName = migClassName

// MIGProfile is one GPU-instance profile of a MIG table: what the choice of
// a profile for a fraction needs.
type MIGProfile struct {
	// Name as nvidia-smi and the device attribute profile spell it.
	Name string
	// ComputeSlices and MemorySlices the profile takes.
	ComputeSlices, MemorySlices int
}

// MIGModel is the MIG geometry of one GPU model.
type MIGModel struct {
	// Key names the model in subrequest names ("h100-80gb").
	Key string
	// Products are the productName attributes of the model's GPUs.
	Products []string
	// ComputeSlices and MemorySlices of the whole GPU.
	ComputeSlices, MemorySlices int
	// Profiles from small to large (compute slices, then memory slices,
	// media-extension profiles after plain ones).
	Profiles []MIGProfile
}

// Profile sizes of the MIG tables: compute slices, memory slices.
func migProfiles(names ...string) []MIGProfile {
	out := make([]MIGProfile, 0, len(names))
	for _, n := range names {
		head, rest, _ := strings.Cut(n, ":")
		var p MIGProfile
		if _, err := fmt.Sscanf(rest, "%d/%d", &p.ComputeSlices, &p.MemorySlices); err != nil {
			panic(fmt.Sprintf("MIG table entry %q: %v", n, err))
		}
		p.Name = head
		out = append(out, p)
	}
	sortMIGProfiles(out)
	return out
}

// migModels are the GPU models whose MIG profiles Tessera knows: profile
// names and slice counts from NVIDIA's Multi-Instance GPU User Guide (r580),
// "Supported MIG Profiles" (the tables for A100 40GB, A100 80GB, H100 80GB
// and H200), the same as the mock NVML's tables (pkg/gpu/mock_mig_tables.go;
// TestMIGModelsAreTheMockTables keeps them equal). The first product of each
// is the one the mock names; the others are assumed to be other form factors
// of the same GPU, which the guide gives one table (not checked against a
// GPU). Keep at most resourceapi.FirstAvailableDeviceRequestMaxSize models.
var migModels = []MIGModel{
	{
		Key:      "a100-40gb",
		Products: []string{"NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"},
		// 7 compute slices, 8 memory slices.
		ComputeSlices: 7, MemorySlices: 8,
		Profiles: migProfiles("1g.5gb:1/1", "1g.5gb+me:1/1", "1g.10gb:1/2", "2g.10gb:2/2", "3g.20gb:3/4", "4g.20gb:4/4", "7g.40gb:7/8"),
	},
	{
		Key:           "a100-80gb",
		Products:      []string{"NVIDIA A100 80GB PCIe", "NVIDIA A100-SXM4-80GB"},
		ComputeSlices: 7, MemorySlices: 8,
		Profiles: migProfiles("1g.10gb:1/1", "1g.10gb+me:1/1", "1g.20gb:1/2", "2g.20gb:2/2", "3g.40gb:3/4", "4g.40gb:4/4", "7g.80gb:7/8"),
	},
	{
		Key:           "h100-80gb",
		Products:      []string{"NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"},
		ComputeSlices: 7, MemorySlices: 8,
		Profiles: migProfiles("1g.10gb:1/1", "1g.10gb+me:1/1", "1g.20gb:1/2", "2g.20gb:2/2", "3g.40gb:3/4", "4g.40gb:4/4", "7g.80gb:7/8"),
	},
	{
		Key:           "h200-141gb",
		Products:      []string{"NVIDIA H200"},
		ComputeSlices: 7, MemorySlices: 8,
		Profiles: migProfiles("1g.18gb:1/1", "1g.18gb+me:1/1", "1g.35gb:1/2", "2g.35gb:2/2", "3g.71gb:3/4", "4g.71gb:4/4", "7g.141gb:7/8"),
	},
}

// MIGModels are the GPU models whose MIG profiles Tessera knows. The result
// is a copy the caller may modify.
func MIGModels() []MIGModel {
	out := make([]MIGModel, len(migModels))
	for i, m := range migModels {
		m.Products = slices.Clone(m.Products)
		m.Profiles = slices.Clone(m.Profiles)
		out[i] = m
	}
	return out
}

// MIGModelOf is the known MIG model of a product name.
func MIGModelOf(product string) (MIGModel, bool) {
	for _, m := range MIGModels() {
		if slices.Contains(m.Products, product) {
			return m, true
		}
	}
	return MIGModel{}, false
}

// sortMIGProfiles orders profiles from small to large: compute slices, then
// memory slices, plain before media-extension ("+me") profiles, as pkg/model
// publishes dynamic placements.
func sortMIGProfiles(ps []MIGProfile) {
	slices.SortStableFunc(ps, func(a, b MIGProfile) int {
		if a.ComputeSlices != b.ComputeSlices {
			return a.ComputeSlices - b.ComputeSlices
		}
		if a.MemorySlices != b.MemorySlices {
			return a.MemorySlices - b.MemorySlices
		}
		return mediaExtension(a.Name) - mediaExtension(b.Name)
	})
}

func mediaExtension(name string) int {
	if strings.Contains(name, "+") {
		return 1
	}
	return 0
}

// covers reports whether n of total slices are at least f.
func covers(n, total int, f Fraction) bool {
	return total > 0 && big.NewRat(int64(n), int64(total)).Cmp(big.NewRat(f.Num, f.Den)) >= 0
}

// Cores is the cores capacity pkg/model publishes for a MIG device of p on
// m: 100 × compute slices / the GPU's, rounded down.
func (m MIGModel) Cores(p MIGProfile) int64 {
	return int64(coresPerGPU * p.ComputeSlices / m.ComputeSlices)
}

// Profile is the smallest profile of m whose compute slices and memory
// slices both cover f of the GPU's. Media-extension profiles are never
// chosen: they take engines a plain profile leaves to others.
func (m MIGModel) Profile(f Fraction) (MIGProfile, error) {
	for _, p := range m.Profiles {
		if mediaExtension(p.Name) == 1 {
			continue
		}
		if covers(p.ComputeSlices, m.ComputeSlices, f) && covers(p.MemorySlices, m.MemorySlices, f) {
			return p, nil
		}
	}
	return MIGProfile{}, fmt.Errorf("%s of %s: no MIG profile covers it", f, strings.Join(m.Products, ", "))
}

// MIGRequest is a MIG request named name for f of whichever GPU model it
// lands on: one firstAvailable subrequest per model (MIGModels' order), each
// of class mig.gpu.tessera.dev with MIGSelector of the model's products and
// its profile for f (Profile). Subrequests are named after the model and the
// profile ("h100-80gb-1g-20gb").
func MIGRequest(name string, f Fraction, models []MIGModel) (resourceapi.DeviceRequest, error) {
	if len(models) == 0 {
		return resourceapi.DeviceRequest{}, errors.New("no GPU model with a known MIG profile table")
	}
	if len(models) > resourceapi.FirstAvailableDeviceRequestMaxSize {
		return resourceapi.DeviceRequest{}, fmt.Errorf("%d GPU models: a request lists at most %d (firstAvailable)", len(models), resourceapi.FirstAvailableDeviceRequestMaxSize)
	}
	req := resourceapi.DeviceRequest{Name: name}
	for _, m := range models {
		p, err := m.Profile(f)
		if err != nil {
			return resourceapi.DeviceRequest{}, err
		}
		req.FirstAvailable = append(req.FirstAvailable, resourceapi.DeviceSubRequest{
			Name:            MIGSubrequestName(m, p),
			DeviceClassName: migClassName,
			AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
			Count:           1,
			Selectors:       []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: MIGSelector(m, p)}}},
		})
	}
	return req, nil
}

// MIGSubrequestName is "<model key>-<profile, '.' and '+' as '-'>".
func MIGSubrequestName(m MIGModel, p MIGProfile) string {
	return m.Key + "-" + strings.NewReplacer(".", "-", "+", "-").Replace(strings.ToLower(p.Name))
}

// MIGSelector selects the MIG devices of profile p on GPUs of model m whose
// compute is the whole profile's: a static compute instance that takes only
// part of its GPU instance (1c.3g.40gb) publishes fewer cores and is left
// out. Devices without a product name or cores are not errors.
func MIGSelector(m MIGModel, p MIGProfile) string {
	attrs := fmt.Sprintf("device.attributes[%q]", driverName)
	capacity := fmt.Sprintf("device.capacity[%q]", driverName)
	names := make([]string, len(m.Products))
	for i, n := range m.Products {
		names[i] = strconv.Quote(n)
	}
	return fmt.Sprintf(`%q in %s && %s.%s in [%s] && %s.%s == %q && %q in %s && %s.%s.compareTo(quantity("%d")) >= 0`,
		string(attrProductName), attrs, attrs, attrProductName, strings.Join(names, ", "),
		attrs, attrProfile, p.Name,
		string(capCores), capacity, capacity, capCores, m.Cores(p))
}

// profileName is what a MIG profile name may hold: nvidia-smi's names are
// letters, digits, '.', '+' and '-' ("1g.10gb+me", "1c.3g.40gb").
var profileName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.+-]*$`)

// CheckMIGProfile refuses a profile name that no MIG device could publish
// (and that would not be a plain CEL string).
func CheckMIGProfile(name string) error {
	if !profileName.MatchString(name) || len(name) > migProfileMaxChars {
		return fmt.Errorf("MIG profile %q: want a name as nvidia-smi mig -lgip prints it, for example 3g.40gb or 1g.10gb+me", name)
	}
	return nil
}

// MIGProfileSelector selects MIG devices of the named profile, on any GPU
// model.
func MIGProfileSelector(name string) string {
	return fmt.Sprintf("device.attributes[%q].%s == %q", driverName, attrProfile, name)
}

// KnownMIGProfile reports which known models have a profile of this name.
func KnownMIGProfile(name string) []MIGModel {
	var out []MIGModel
	for _, m := range MIGModels() {
		if slices.ContainsFunc(m.Profiles, func(p MIGProfile) bool { return p.Name == name }) {
			out = append(out, m)
		}
	}
	return out
}
