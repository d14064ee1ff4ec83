package publish

import (
	"context"
	"testing"

	"k8s.io/klog/v2/ktesting"
)

const testNode = "node-a"

// ctxFor logs through t.
func ctxFor(t testing.TB) context.Context {
	_, ctx := ktesting.NewTestContext(t)
	return ctx
}
