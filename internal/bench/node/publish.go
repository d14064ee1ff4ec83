package node

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/tessera-dev/tessera/pkg/model"
)

// Writes counts API writes of ResourceSlices.
type Writes struct {
	Create, Update, Delete int
}

// Total is the number of writes.
func (w Writes) Total() int { return w.Create + w.Update + w.Delete }

func (w Writes) sub(o Writes) Writes {
	return Writes{Create: w.Create - o.Create, Update: w.Update - o.Update, Delete: w.Delete - o.Delete}
}

// apiServer is client-go's fake clientset with the two things the
// ResourceSlice controller needs from a real API server: the node (for its
// UID) and generateName.
type apiServer struct {
	client *fake.Clientset
	names  atomic.Int64
}

func newAPIServer(nodeName string) *apiServer {
	s := &apiServer{client: fake.NewSimpleClientset(&corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: types.UID("uid-" + nodeName)},
	})}
	// The tracker neither fills in generateName nor sets resourceVersion
	// (the controller's mutation cache compares them); do both, then let
	// the tracker store the object.
	s.client.PrependReactor("create", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		slice, ok := a.(k8stesting.CreateAction).GetObject().(*resourceapi.ResourceSlice)
		if !ok {
			return false, nil, nil
		}
		n := s.names.Add(1)
		if slice.Name == "" && slice.GenerateName != "" {
			slice.Name = slice.GenerateName + strconv.FormatInt(n, 10)
		}
		slice.ResourceVersion = strconv.FormatInt(n, 10)
		return false, nil, nil
	})
	s.client.PrependReactor("update", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if slice, ok := a.(k8stesting.UpdateAction).GetObject().(*resourceapi.ResourceSlice); ok {
			slice.ResourceVersion = strconv.FormatInt(s.names.Add(1), 10)
		}
		return false, nil, nil
	})
	return s
}

// writes counts the writes of resourceslices so far.
func (s *apiServer) writes() Writes {
	var w Writes
	for _, a := range s.client.Actions() {
		if a.GetResource().Resource != "resourceslices" {
			continue
		}
		switch a.GetVerb() {
		case "create":
			w.Create++
		case "update", "patch", "apply":
			w.Update++
		case "delete", "delete-collection":
			w.Delete++
		}
	}
	return w
}

// slices lists the stored ResourceSlices.
func (s *apiServer) slices(ctx context.Context) ([]resourceapi.ResourceSlice, error) {
	list, err := s.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// settle waits until done holds for the stored slices and no write has
// happened for quiet; it returns the writes counted then.
func (s *apiServer) settle(ctx context.Context, done func([]resourceapi.ResourceSlice) bool, quiet, timeout time.Duration) (Writes, error) {
	deadline := time.Now().Add(timeout)
	last, lastChange := s.writes(), time.Now()
	for {
		got, err := s.slices(ctx)
		if err != nil {
			return Writes{}, err
		}
		w := s.writes()
		if w != last {
			last, lastChange = w, time.Now()
		}
		if done(got) && time.Since(lastChange) >= quiet {
			return w, nil
		}
		if time.Now().After(deadline) {
			return Writes{}, fmt.Errorf("ResourceSlices not published as expected within %s: %d stored, writes so far %+v", timeout, len(got), w)
		}
		select {
		case <-ctx.Done():
			return Writes{}, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// slicePublisher is what kubeletplugin.Helper.PublishResources does, without
// the gRPC servers: start the ResourceSlice controller with the node as
// owner on the first publish, update it afterwards.
type slicePublisher struct {
	ctx      context.Context // the controller's lifetime
	nodeName string
	client   *fake.Clientset
	// syncDelay and cacheTTL shorten the controller's follow-up syncs
	// (30 s and 1 min by default) so that all the writes it would make
	// happen within the measurement.
	syncDelay, cacheTTL time.Duration

	mu         sync.Mutex
	controller *resourceslice.Controller

	errMu sync.Mutex
	errs  []error
}

func (p *slicePublisher) PublishResources(_ context.Context, resources resourceslice.DriverResources) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	desired := &resourceslice.DriverResources{Pools: resources.Pools}
	if p.controller != nil {
		p.controller.Update(desired)
		return nil
	}
	c, err := resourceslice.StartController(p.ctx, resourceslice.Options{
		DriverName:       model.DriverName,
		KubeClient:       p.client,
		Owner:            &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: p.nodeName},
		Resources:        desired,
		SyncDelay:        &p.syncDelay,
		MutationCacheTTL: &p.cacheTTL,
		ErrorHandler: func(_ context.Context, err error, msg string) {
			p.errMu.Lock()
			defer p.errMu.Unlock()
			p.errs = append(p.errs, fmt.Errorf("%s: %w", msg, err))
		},
	})
	if err != nil {
		return fmt.Errorf("start ResourceSlice controller: %w", err)
	}
	p.controller = c
	return nil
}

// err returns the errors the controller reported.
func (p *slicePublisher) err() error {
	p.errMu.Lock()
	defer p.errMu.Unlock()
	return errors.Join(p.errs...)
}

func (p *slicePublisher) stop() {
	p.mu.Lock()
	c := p.controller
	p.mu.Unlock()
	c.Stop()
}
