package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/health"
	"github.com/tessera-dev/tessera/pkg/metrics"
	"github.com/tessera-dev/tessera/pkg/metricsserver"
	"github.com/tessera-dev/tessera/pkg/model"
	"github.com/tessera-dev/tessera/pkg/publish"
)

// startServers registers the plugin's and the inventory's metrics and
// starts the HTTPS server of /metrics and /healthz (--metrics-address) and
// the mock fault-injection knob (--mock-fault-injection).
//
// /healthz fails when the helper's gRPC servers stop answering or the
// inventory loop that publishes the slices has stopped; a node without
// GPUs is reported, not failed (see publish.Inventory.HealthzHandler).
func (d *daemon) startServers(ctx context.Context) error {
	var usage *metrics.Usage
	if d.lib != nil {
		usage = &metrics.Usage{Lib: d.lib, ProcRoot: d.f.node.procRoot, Pods: d.plugin}
	}
	d.metrics.AddState(d.plugin, usage)
	d.metrics.AddDiscovery(d.inv)
	d.healthz = &metricsserver.Health{Status: d.inv.Status}
	d.healthz.Add("kubelet-plugin-grpc", d.sockets.Check)
	d.healthz.Add("slice-publisher", d.publisher.Check)
	if d.f.metrics.address != "" {
		if err := d.startMetricsServer(ctx); err != nil {
			return err
		}
	}
	if node, ok := d.lib.(*gpu.MockNode); ok && d.f.mock.faultInjection {
		addr := d.f.mock.knobAddress
		klog.FromContext(ctx).Info("TEST KNOB: NVML fault injection served without authentication", "address", addr, "paths", "/mock/xid, /mock/dbe, /mock/lost, /mock/discovery, /mock/process, /healthz")
		mux := http.NewServeMux()
		mux.Handle("/mock/", node.FaultHandler())
		mux.Handle("/healthz", d.healthz)
		go serveMockKnob(ctx, addr, mux)
	}
	return nil
}

// startMetricsServer checks the metrics server's configuration and
// certificate and serves it until ctx is done.
func (d *daemon) startMetricsServer(ctx context.Context) error {
	f := d.f.metrics
	// Reviews of scrapers' tokens use a client of their own, limited
	// to metricsserver.DelegatedQPS.
	auth, err := metricsserver.NewDelegatedForConfig(d.config)
	if err != nil {
		return err
	}
	srv := &metricsserver.Server{
		Address:        f.address,
		Certificate:    &metricsserver.Certificate{CertFile: f.tlsCert, KeyFile: f.tlsKey, Host: d.f.node.name},
		Auth:           auth,
		Metrics:        d.metrics.Handler(),
		Health:         d.healthz,
		RequestTimeout: f.timeout,
		MaxInFlight:    f.maxInFlight,
	}
	if _, err := srv.Handler(); err != nil {
		return err
	}
	if _, err := srv.Certificate.Load(); err != nil {
		return fmt.Errorf("--metrics-tls-cert-file/--metrics-tls-key-file: %w", err)
	}
	go func() {
		if err := srv.Run(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Metrics server stopped", "address", f.address)
		}
	}()
	return nil
}

// serveMockKnob serves the test knob's mux on addr until ctx is done. A busy
// address (the other pod of a surge rolling update on the host network still
// holds it) is retried every few seconds instead of failing the plugin.
func serveMockKnob(ctx context.Context, addr string, mux *http.ServeMux) {
	logger := klog.FromContext(ctx)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	for {
		logger.Info("Serving the mock fault-injection knob", "address", addr)
		err := srv.ListenAndServe()
		if errors.Is(err, http.ErrServerClosed) || ctx.Err() != nil {
			return
		}
		logger.Error(err, "Mock fault-injection server failed; retrying", "address", addr)
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
	}
}

// startKubeletPlugin registers the plugin with the kubelet and serves its
// DRA gRPC API (kubeletplugin.Helper), in rolling-update mode when it runs
// in a pod (POD_UID).
func (d *daemon) startKubeletPlugin(ctx context.Context) (*kubeletplugin.Helper, error) {
	f := d.f
	helperOpts := []kubeletplugin.Option{
		kubeletplugin.DriverName(model.DriverName),
		kubeletplugin.KubeClient(d.client),
		kubeletplugin.NodeName(f.node.name),
		kubeletplugin.PluginDataDirectoryPath(f.kubelet.pluginDataDir),
		kubeletplugin.RegistrarDirectoryPath(f.kubelet.registrarDir),
		kubeletplugin.PluginListener(d.sockets.Listen),
		kubeletplugin.RegistrarListener(d.sockets.Listen),
	}
	if uid := os.Getenv("POD_UID"); uid != "" {
		helperOpts = append(helperOpts, kubeletplugin.RollingUpdate(types.UID(uid)))
	}
	helper, err := kubeletplugin.Start(ctx, d.plugin, helperOpts...)
	if err != nil {
		return nil, fmt.Errorf("start kubelet plugin: %w", err)
	}
	return helper, nil
}

// publish publishes the GPUs through the helper once, then keeps them in
// line every --rediscover-interval. Discovery errors are reported by the
// inventory; only a failed publication stops the plugin.
func (d *daemon) publish(ctx context.Context, helper *kubeletplugin.Helper) error {
	d.inv.Publisher = helper
	if _, err := d.inv.Sync(ctx); err != nil && !errors.Is(err, publish.ErrDiscovery) {
		return err
	}
	go d.publisher.Run(func() { d.inv.Run(ctx, d.f.node.rediscoverEvery) })
	return nil
}

// watchHealth republishes the taints on every health change and watches
// NVML's error events. The returned function waits for the watcher to
// stop (NVML must not be shut down before its last wait).
func (d *daemon) watchHealth(ctx context.Context) (wait func()) {
	if d.tracker == nil {
		return func() {}
	}
	go publish.FollowHealth(ctx, d.tracker, d.inv)
	if d.lib == nil {
		return func() {}
	}
	watcherDone := make(chan struct{})
	go func() {
		defer close(watcherDone)
		w := &health.Watcher{Lib: d.lib, Tracker: d.tracker}
		if err := w.Run(ctx); err != nil {
			// Health stays "healthy" for every GPU; the plugin keeps serving.
			klog.FromContext(ctx).Error(err, "GPU error events cannot be watched; device health is not monitored")
		}
	}()
	return func() { <-watcherDone }
}

// restartWithNVML has a plugin that started without NVML restart (through
// restart) once NVML can be opened.
func (d *daemon) restartWithNVML(ctx context.Context, restart context.CancelCauseFunc) {
	if d.lib != nil {
		return
	}
	go func() {
		open := func() (nvml.Interface, error) { return gpu.OpenNVML(d.f.node.driverRoot) }
		if gpu.WaitForNVML(ctx, d.f.node.rediscoverEvery, open) {
			d.events.Event(corev1.EventTypeNormal, "NVMLAvailable", "NVML can be opened now: the kubelet plugin restarts to publish the GPUs.")
			restart(errNVMLAvailable)
		}
	}()
}
