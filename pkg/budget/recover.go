package budget

import (
	"context"
	"fmt"
	"runtime/debug"

	"k8s.io/klog/v2"
)

// recovered, deferred, turns a panic of the function it is deferred in into
// *err and logs it with its stack, so that a bug tripped by one claim (an
// admission) or one namespace (a reconciler pass) fails that item alone: the
// process, which with failurePolicy Fail every claim creation of the
// cluster waits on, keeps serving.
func recovered(ctx context.Context, what string, err *error) {
	r := recover()
	if r == nil {
		return
	}
	klog.FromContext(ctx).Error(nil, "Recovered from a panic", "in", what, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
	*err = fmt.Errorf("%s: internal error: %v", what, r)
}
