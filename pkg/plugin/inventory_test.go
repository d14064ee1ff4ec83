package plugin

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
	"github.com/tessera-dev/tessera/pkg/publish"
	"github.com/tessera-dev/tessera/pkg/publish/publishtest"
)

// A node without GPUs, or without NVML, keeps the plugin up: without NVML
// nothing is published (an empty pool would replace the slices of an instance
// that can see the GPUs), with NVML and no GPUs an empty pool; the status and
// a Node event say why, and claims prepared earlier (by a process that had
// GPUs) can still be unprepared.
func TestInventoryNoGPUs(t *testing.T) {
	ctx := ctxFor(t)
	e := newEnv(t)
	before := e.start(nil)
	claim := newClaim("uid-1", []result{whole("gpu", "gpu-2")})
	mustPrepare(t, before.Plugin, claim)

	// The driver is gone after a restart: NVML cannot be loaded.
	noLib := fmt.Errorf("NVML library libnvidia-ml.so.1 not found under driver root \"/\": %w", gpu.ErrLibraryNotFound)
	after := e.start(func(o *Options) { o.GPUs = nil })
	pub := &publishtest.Publisher{}
	inv := &publish.Inventory{NodeName: testNode, DiscoverNode: publish.NVMLDiscovery(nil, noLib), Publisher: pub, Events: e.events, OnChange: after.SetGPUs}
	if s := inv.Status(); !strings.HasPrefix(s, "starting") {
		t.Errorf("status before the first sync: %q", s)
	}
	changed, err := inv.Sync(ctx)
	if !errors.Is(err, gpu.ErrLibraryNotFound) || !errors.Is(err, publish.ErrDiscovery) || changed || inv.Synced() {
		t.Fatalf("sync: changed %v, synced %v, err %v; want nothing published and the NVML error", changed, inv.Synced(), err)
	}
	// Nothing is published: slices another instance published stay.
	if len(pub.Published) != 0 {
		t.Errorf("published %d times without NVML, want never", len(pub.Published))
	}
	if !publishtest.HasEvent(e.events.List(), "Warning NoGPUs", "libnvidia-ml.so.1 not found", "can still be unprepared") {
		t.Errorf("events %q, want Warning NoGPUs naming the library", e.events.List())
	}
	rec := httptest.NewRecorder()
	inv.HealthzHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if body := rec.Body.String(); rec.Code != http.StatusOK || !strings.HasPrefix(body, "ok: no GPUs: discover GPUs: NVML library libnvidia-ml.so.1 not found") {
		t.Errorf("/healthz: %d %q", rec.Code, body)
	}
	if snap := inv.DiscoverySnapshot(); snap.Up || snap.GPUs != 0 {
		t.Errorf("metrics snapshot %+v", snap)
	}
	// Repeated failures are neither republished nor re-reported.
	n := len(e.events.List())
	if changed, _ := inv.Sync(ctx); changed || len(e.events.List()) != n {
		t.Errorf("second sync: changed %v, new events %q", changed, e.events.List()[n:])
	}
	mustUnprepare(t, after.Plugin, claim.UID)
	e.assertClean(after)

	// NVML works but reports no GPU.
	node := gputest.MockNode(t, "l4x4")
	node.Devices = nil
	events := &publishtest.Events{}
	pub = &publishtest.Publisher{}
	inv = &publish.Inventory{NodeName: testNode, DiscoverNode: publish.NVMLDiscovery(node, nil), Publisher: pub, Events: events}
	if changed, err := inv.Sync(ctx); err != nil || !changed {
		t.Fatalf("no GPUs: changed %v, err %v", changed, err)
	}
	if devs, n := pub.Devices(t); len(devs) != 0 || n != 1 {
		t.Errorf("published %d devices in %d slices, want an empty pool", len(devs), n)
	}
	if !publishtest.HasEvent(events.List(), "Warning NoGPUs", "NVML reports no GPU") {
		t.Errorf("events %q", events.List())
	}
	if s := inv.Status(); s != "ok: no GPUs: NVML reports none on this node" {
		t.Errorf("status %q", s)
	}
	// A GPU appears (hot-plug, or the driver came up): published, reported.
	fresh := gputest.MockNode(t, "l4x4")
	node.Devices = fresh.Devices
	if changed, err := inv.Sync(ctx); err != nil || !changed {
		t.Fatalf("GPUs appeared: changed %v, err %v", changed, err)
	}
	if !publishtest.HasEvent(events.List(), "Normal GPUsDiscovered", "4 GPUs published") {
		t.Errorf("events %q", events.List())
	}
}
