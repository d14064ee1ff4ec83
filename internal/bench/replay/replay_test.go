package replay

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-dev/tessera/internal/bench/fleet"
)

// TestReplayAgainstAFakeScheduler: with a stand-in scheduler that binds every
// pod at once to one of two "GPUs" and one job per GPU, the replay measures
// the starts that scheduler produced and deletes every pod and claim.
func TestReplayAgainstAFakeScheduler(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := fake.NewClientset()
	jobs := []fleet.Job{
		{ID: 0, Arrival: 0, Memory: 0.3, Cores: 0.3, Demand: 0.3, Runtime: 100},
		{ID: 1, Arrival: 10, Memory: 0.3, Cores: 0.3, Demand: 0.3, Runtime: 100},
		{ID: 2, Arrival: 20, Memory: 0.3, Cores: 0.3, Demand: 0.3, Runtime: 100},
	}
	const speed = 25 // simulated seconds per second: the run takes about 8 s

	// The stand-in scheduler: two slots; a pending pod is bound when a slot is
	// free (a pod's deletion frees its slot).
	var wg sync.WaitGroup
	wg.Go(func() {
		held := map[string]bool{}
		for ctx.Err() == nil {
			pods, err := c.CoreV1().Pods("fleet").List(ctx, metav1.ListOptions{})
			if err != nil {
				return
			}
			live := map[string]bool{}
			for _, p := range pods.Items {
				live[p.Name] = true
			}
			for name := range held {
				if !live[name] {
					delete(held, name)
				}
			}
			for _, p := range pods.Items {
				if p.Spec.NodeName == "" && len(held) < 2 {
					p.Spec.NodeName = "node-0"
					if _, err := c.CoreV1().Pods("fleet").Update(ctx, &p, metav1.UpdateOptions{}); err == nil {
						held[p.Name] = true
					}
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	out, err := Replay(ctx, Config{Client: c, Namespace: "fleet", Kind: fleet.Tessera, Jobs: jobs, Speed: speed, Stall: 10 * time.Second})
	t.Logf("replay took %s", out.Wall)
	cancel()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	// Jobs 0 and 1 start on arrival, job 2 when job 0 ends (at 100 s).
	for i, want := range []float64{0, 10, 100} {
		if math.Abs(out.Starts[i]-want) > 10 {
			t.Errorf("job %d started at %.1fs, want about %.0fs", i, out.Starts[i], want)
		}
	}
	pods, _ := c.CoreV1().Pods("fleet").List(context.Background(), metav1.ListOptions{})
	claims, _ := c.ResourceV1().ResourceClaims("fleet").List(context.Background(), metav1.ListOptions{})
	if len(pods.Items)+len(claims.Items) != 0 {
		t.Errorf("left %d pods and %d claims", len(pods.Items), len(claims.Items))
	}
	r, err := fleet.Summarize(fleet.Tessera, jobs, out.Starts)
	if err != nil || r.WaitP99 < 70 {
		t.Errorf("summary %+v, %v", r, err)
	}
}

func TestReplayClaimsAreTheSimulations(t *testing.T) {
	c := fake.NewClientset()
	j := fleet.Job{Memory: 0.25, Cores: 0.25, Demand: 0.25}
	spec, err := fleet.ClaimSpec(fleet.Tessera, &j)
	if err != nil {
		t.Fatal(err)
	}
	if err := create(context.Background(), c, "fleet", "r", 7, spec); err != nil {
		t.Fatal(err)
	}
	p, err := c.CoreV1().Pods("fleet").Get(context.Background(), "job-00007", metav1.GetOptions{})
	if err != nil || p.Spec.ResourceClaims[0].ResourceClaimName == nil || *p.Spec.ResourceClaims[0].ResourceClaimName != "job-00007" ||
		p.Spec.Containers[0].Resources.Claims[0].Name != "gpu" || p.Labels[RunLabel] != "r" {
		t.Errorf("pod %+v, %v", p, err)
	}
	claim, err := c.ResourceV1().ResourceClaims("fleet").Get(context.Background(), "job-00007", metav1.GetOptions{})
	if err != nil || len(claim.Spec.Devices.Requests[0].FirstAvailable) != 1 || claim.Spec.Devices.Requests[0].FirstAvailable[0].DeviceClassName != fleet.SharedClass {
		t.Errorf("claim %+v, %v", claim, err)
	}
	if _, err := Replay(context.Background(), Config{Client: c, Kind: fleet.Tessera}); err == nil {
		t.Error("speed 0 accepted")
	}
	_ = corev1.Pod{}
}
