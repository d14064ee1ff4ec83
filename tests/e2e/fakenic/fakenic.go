// Package fakenic is a second DRA driver for end-to-end tests: a kubelet
// plugin, built on k8s.io/dynamic-resource-allocation/kubeletplugin, that
// publishes a node's network cards (NICs) with the standard
// resource.kubernetes.io/pcieRoot attribute and prepares them without
// touching anything. It lets a test on the node ask the real scheduler for a
// GPU and a NIC under the same PCIe root.
//
// The plugin runs in the test's own process, beside the kubelet (the process
// needs root and the kubelet's directories): it registers in the kubelet's
// plugins_registry, serves the DRA gRPC API from its own directory under the
// kubelet's plugins directory and publishes one ResourceSlice for the node.
// Stop undoes all three.
package fakenic

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
)

// DefaultDriver is the driver name Start uses when Options.Driver is empty.
const DefaultDriver = "nic.e2e.tessera.dev"

// NIC is one published network card.
type NIC struct {
	// Name is the device name, also published as the attribute "name" so
	// that a selector can pick one card.
	Name string
	// PCIeRoot is the value of resource.kubernetes.io/pcieRoot ("pci0000:15");
	// empty publishes the card without it.
	PCIeRoot string
}

// Options configure Start.
type Options struct {
	// Client talks to the API server: it needs to read the Node and to
	// create, update and delete the driver's ResourceSlices.
	Client kubernetes.Interface
	// NodeName is the node the plugin runs on (the kubelet's node).
	NodeName string
	// Driver is the driver name; DefaultDriver when empty.
	Driver string
	// NICs are the devices of the node's pool.
	NICs []NIC
	// RegistrarDir is the kubelet's plugin registration directory;
	// kubeletplugin.KubeletRegistryDir (/var/lib/kubelet/plugins_registry)
	// when empty.
	RegistrarDir string
	// PluginDataDir is the plugin's own directory for its DRA socket,
	// created by Start and removed by Stop;
	// /var/lib/kubelet/plugins/<driver> when empty.
	PluginDataDir string
}

// Plugin is a running fake NIC driver.
type Plugin struct {
	opts   Options
	helper *kubeletplugin.Helper

	mu       sync.Mutex
	prepared map[types.UID][]string // claim → device names
	errs     []error
}

// Start starts the kubelet plugin (registration and DRA sockets) and
// publishes the NICs. The kubelet registers it asynchronously; Registered
// says when it did. The caller stops it with Stop.
func Start(ctx context.Context, opts Options) (*Plugin, error) {
	if opts.Client == nil || opts.NodeName == "" {
		return nil, errors.New("fakenic: Client and NodeName are required")
	}
	if opts.Driver == "" {
		opts.Driver = DefaultDriver
	}
	if opts.RegistrarDir == "" {
		opts.RegistrarDir = kubeletplugin.KubeletRegistryDir
	}
	if opts.PluginDataDir == "" {
		opts.PluginDataDir = filepath.Join(kubeletplugin.KubeletPluginsDir, opts.Driver)
	}
	resources, err := Resources(opts.NodeName, opts.NICs)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.PluginDataDir, 0o750); err != nil {
		return nil, fmt.Errorf("fakenic: %w", err)
	}
	p := &Plugin{opts: opts, prepared: map[types.UID][]string{}}
	helper, err := kubeletplugin.Start(ctx, p,
		kubeletplugin.KubeClient(opts.Client),
		kubeletplugin.NodeName(opts.NodeName),
		kubeletplugin.DriverName(opts.Driver),
		kubeletplugin.RegistrarDirectoryPath(opts.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(opts.PluginDataDir),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		_ = os.RemoveAll(opts.PluginDataDir)
		return nil, fmt.Errorf("fakenic: start kubelet plugin %s: %w", opts.Driver, err)
	}
	p.helper = helper
	if err := helper.PublishResources(ctx, resources); err != nil {
		_ = p.Stop(ctx)
		return nil, fmt.Errorf("fakenic: publish: %w", err)
	}
	return p, nil
}

// Resources is the pool the plugin publishes for node: one slice with the
// NICs, each with the attributes "type" ("nic") and "name" in the driver's
// domain and, when set, resource.kubernetes.io/pcieRoot.
func Resources(node string, nics []NIC) (resourceslice.DriverResources, error) {
	devices := make([]resourceapi.Device, 0, len(nics))
	seen := map[string]bool{}
	for i, n := range nics {
		if n.Name == "" || seen[n.Name] {
			return resourceslice.DriverResources{}, fmt.Errorf("fakenic: NIC %d: name %q is empty or repeated", i, n.Name)
		}
		seen[n.Name] = true
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type": {StringValue: ptr.To("nic")},
			"name": {StringValue: ptr.To(n.Name)},
		}
		if n.PCIeRoot != "" {
			attrs[deviceattribute.StandardDeviceAttributePCIeRoot] = resourceapi.DeviceAttribute{StringValue: ptr.To(n.PCIeRoot)}
		}
		devices = append(devices, resourceapi.Device{Name: n.Name, Attributes: attrs})
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		node: {Slices: []resourceslice.Slice{{Devices: devices}}},
	}}, nil
}

// DeviceClass is the class that selects the driver's devices.
func DeviceClass(name, driver string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
			CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", driver)},
		}}},
	}
}

// Driver is the plugin's driver name.
func (p *Plugin) Driver() string { return p.opts.Driver }

// Registered reports whether the kubelet has registered the plugin.
func (p *Plugin) Registered() bool {
	s := p.helper.RegistrationStatus()
	return s != nil && s.PluginRegistered
}

// Prepared returns the devices the kubelet had the plugin prepare for a
// claim (nil when none, or after it was unprepared).
func (p *Plugin) Prepared(claim types.UID) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.prepared[claim]...)
}

// Errors are the errors the helper reported in the background (publishing,
// gRPC servers).
func (p *Plugin) Errors() []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]error(nil), p.errs...)
}

// Stop stops the plugin's gRPC servers (which removes its sockets, so the
// kubelet deregisters it), deletes its ResourceSlices for the node and
// removes its registration socket (if left) and its plugin directory. It
// returns what it could not undo.
func (p *Plugin) Stop(ctx context.Context) error {
	p.helper.Stop()
	var errs []error
	// The API server filters by driver and node; the check below keeps a
	// client that ignores field selectors from deleting other drivers'.
	list, err := p.opts.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: fields.AndSelectors(
			fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, p.opts.Driver),
			fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, p.opts.NodeName),
		).String(),
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("list ResourceSlices of %s: %w", p.opts.Driver, err))
	} else {
		for _, s := range list.Items {
			if s.Spec.Driver != p.opts.Driver || ptr.Deref(s.Spec.NodeName, "") != p.opts.NodeName {
				continue
			}
			err := p.opts.Client.ResourceV1().ResourceSlices().Delete(ctx, s.Name, metav1.DeleteOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("delete ResourceSlice %s: %w", s.Name, err))
			}
		}
	}
	reg := filepath.Join(p.opts.RegistrarDir, p.opts.Driver+"-reg.sock")
	if err := os.Remove(reg); err != nil && !os.IsNotExist(err) {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(p.opts.PluginDataDir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin: every device of
// the driver in a claim's allocation is prepared, with no CDI device (a fake
// NIC gives the container nothing).
func (p *Plugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		var res kubeletplugin.PrepareResult
		var names []string
		if c.Status.Allocation == nil {
			res.Err = fmt.Errorf("claim %s/%s is not allocated", c.Namespace, c.Name)
			out[c.UID] = res
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != p.opts.Driver {
				continue
			}
			res.Devices = append(res.Devices, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device})
			names = append(names, r.Device)
		}
		p.prepared[c.UID] = names
		out[c.UID] = res
	}
	return out, nil
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin.
func (p *Plugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		delete(p.prepared, c.UID)
		out[c.UID] = nil
	}
	return out, nil
}

// HandleError implements kubeletplugin.DRAPlugin: errors are kept for
// Errors; none stops the plugin.
func (p *Plugin) HandleError(_ context.Context, err error, msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errs = append(p.errs, fmt.Errorf("%s: %w", msg, err))
}

// WatchHealthStatus implements kubeletplugin.DRAPlugin; the plugin turns the
// health service off, so the kubelet never calls it.
func (p *Plugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
