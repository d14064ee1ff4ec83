package helm

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"

	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/deployments/helm/pluginflags"
	"github.com/tessera-dev/tessera/pkg/isolation"
	"github.com/tessera-dev/tessera/pkg/mpsdaemon"
)

// compiledPolicy compiles a ValidatingAdmissionPolicy the way the API
// server's admission plugin does (policy/validating.compilePolicy, which is
// not exported): the same CEL environment, variables, match conditions and
// message expressions.
func compiledPolicy(t *testing.T, policy *admissionregistrationv1.ValidatingAdmissionPolicy) validating.Validator {
	t.Helper()
	optional := cel.OptionalVariableDeclarations{HasAuthorizer: true}
	compiler, err := cel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		t.Fatal(err)
	}
	var vars []cel.NamedExpressionAccessor
	for _, v := range policy.Spec.Variables {
		vars = append(vars, &validating.Variable{Name: v.Name, Expression: v.Expression})
	}
	compiler.CompileAndStoreVariables(vars, optional, environment.StoredExpressions)
	var match []cel.ExpressionAccessor
	for i := range policy.Spec.MatchConditions {
		match = append(match, (*matchconditions.MatchCondition)(&policy.Spec.MatchConditions[i]))
	}
	validations := make([]cel.ExpressionAccessor, len(policy.Spec.Validations))
	messages := make([]cel.ExpressionAccessor, len(policy.Spec.Validations))
	for i, v := range policy.Spec.Validations {
		validations[i] = &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason}
		if v.MessageExpression != "" {
			messages[i] = &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}
		}
	}
	// Every expression must compile: a compile error would make the
	// policy refuse every request (failurePolicy: Fail).
	for _, c := range [][]cel.ExpressionAccessor{match, validations} {
		for _, err := range compiler.CompileCondition(c, optional, environment.StoredExpressions).CompilationErrors() {
			t.Fatalf("policy %s: %v", policy.Name, err)
		}
	}
	return validating.NewValidator(
		compiler.CompileCondition(validations, optional, environment.StoredExpressions),
		matchconditions.NewMatcher(compiler.CompileCondition(match, optional, environment.StoredExpressions), policy.Spec.FailurePolicy, "policy", "validate", policy.Name),
		compiler.CompileCondition(nil, optional, environment.StoredExpressions),
		compiler.CompileCondition(messages, cel.OptionalVariableDeclarations{}, environment.StoredExpressions),
		policy.Spec.FailurePolicy, nil)
}

var podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// admit evaluates the policy on a pod request by u and returns the messages
// of the validations that deny it (nil: admitted).
func admit(t *testing.T, v validating.Validator, op admission.Operation, pod *corev1.Pod, u user.Info) []string {
	t.Helper()
	var obj, old *corev1.Pod
	if op == admission.Delete {
		old = pod
	} else {
		obj = pod
	}
	return denials(v, corev1.SchemeGroupVersion.WithKind("Pod"), podsGVR, "", op, nilIfNone(obj), nilIfNone(old), pod.Namespace, pod.Name, u)
}

// denials evaluates a compiled policy on one request (obj after it, nil on
// DELETE; old before it, nil on CREATE) and returns the messages of the
// validations that deny it (nil: admitted).
func denials(v validating.Validator, gvk schema.GroupVersionKind, gvr schema.GroupVersionResource, subresource string,
	op admission.Operation, obj, old runtime.Object, namespace, name string, u user.Info) []string {
	attr := admission.NewAttributesRecord(obj, old, gvk, namespace, name, gvr, subresource, op, nil, false, u)
	versioned := &admission.VersionedAttributes{Attributes: attr, VersionedKind: gvk}
	versioned.VersionedObject.Set(obj)
	versioned.VersionedOldObject.Set(old)
	res := v.Validate(context.Background(), gvr, versioned, nil, nil, celconfig.RuntimeCELCostBudget, nil)
	var denied []string
	for _, d := range res.Decisions {
		if d.Action != validating.ActionAdmit {
			denied = append(denied, d.Message)
		}
	}
	return denied
}

// nilIfNone keeps a nil *Pod from becoming a non-nil runtime.Object.
func nilIfNone(p *corev1.Pod) runtime.Object {
	if p == nil {
		return nil
	}
	return p
}

// pluginUser is the plugin's service account with a token bound to a pod on
// node.
func pluginUser(node string) user.Info {
	return &user.DefaultInfo{
		Name:   serviceaccount.MakeUsername("tessera", "tessera-kubelet-plugin"),
		Groups: serviceaccount.MakeGroupNames("tessera"),
		Extra:  map[string][]string{serviceaccount.NodeNameKey: {node}},
	}
}

// daemonConfig is the mpsdaemon.Config the rendered plugin would use on node
// (from its flags in the DaemonSet) and the MPS root it would use.
func daemonConfig(t *testing.T, ds *appsv1.DaemonSet, node string) (mpsdaemon.Config, string) {
	t.Helper()
	cfg, root := pluginflags.MPSDaemon(ds.Spec.Template.Spec.Containers[0].Args, "tessera", node)
	if cfg.Image == "" {
		t.Fatalf("the DaemonSet passes no --mps-image: %v", ds.Spec.Template.Spec.Containers[0].Args)
	}
	return cfg, root
}

// TestMPSPodPolicy evaluates the chart's MPS pod policy, compiled as the API
// server compiles it, on the daemon pods pkg/mpsdaemon builds from the
// rendered plugin's own flags (they must pass, or MPS shares never start)
// and on what a compromised plugin could try instead.
func TestMPSPodPolicy(t *testing.T) {
	for name, args := range map[string][]string{
		"default":    nil,
		"local":      {"-f", "../../demo/clusters/local/overlay/values.yaml"},
		"own root":   {"--set", "kubeletPlugin.mps.root=/run/tessera/mps/,kubeletPlugin.driverRoot=/run/nvidia/driver"},
		"own image":  {"--set", "kubeletPlugin.mps.image.repository=example.com/mps,kubeletPlugin.mps.image.tag=v9,imagePullSecrets[0].name=regcred"},
		"mock, pull": {"--set", "kubeletPlugin.mockProfile=l4x4,imagePullSecrets[0].name=a,imagePullSecrets[1].name=b"},
	} {
		t.Run(name, func(t *testing.T) {
			objs := objects(t, render(t, args...))
			policy := find[admissionregistrationv1.ValidatingAdmissionPolicy](t, objs, "ValidatingAdmissionPolicy", "tessera-kubelet-plugin-mps-pods")
			binding := find[admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, objs, "ValidatingAdmissionPolicyBinding", "tessera-kubelet-plugin-mps-pods")
			if binding.Spec.PolicyName != policy.Name || len(binding.Spec.ValidationActions) != 1 || binding.Spec.ValidationActions[0] != admissionregistrationv1.Deny {
				t.Errorf("binding %+v: want policy %s with [Deny]", binding.Spec, policy.Name)
			}
			if policy.Spec.FailurePolicy == nil || *policy.Spec.FailurePolicy != admissionregistrationv1.Fail {
				t.Errorf("failurePolicy %v: want Fail (a policy that cannot be evaluated must refuse)", policy.Spec.FailurePolicy)
			}
			v := compiledPolicy(t, policy)
			ds := find[appsv1.DaemonSet](t, objs, "DaemonSet", "tessera-kubelet-plugin")
			cfg, root := daemonConfig(t, ds, "node-a")
			daemon := func() *corev1.Pod {
				return cfg.Pod(isolation.NewMPS(root, nil).Daemon("GPU-0f5e6a2c-1111-2222-3333-444455556666", "team-a"))
			}
			onA := pluginUser("node-a")

			if denied := admit(t, v, admission.Create, daemon(), onA); denied != nil {
				t.Fatalf("the plugin's own daemon pod is refused: %v", denied)
			}
			// The GPU-wide daemon of earlier releases (no domain) is
			// adopted and restarted with its plain directories.
			if denied := admit(t, v, admission.Create, cfg.Pod(isolation.NewMPS(root, nil).Daemon("GPU-0f5e6a2c-1111-2222-3333-444455556666", "")), onA); denied != nil {
				t.Fatalf("the plugin's GPU-wide daemon pod is refused: %v", denied)
			}
			if denied := admit(t, v, admission.Delete, daemon(), onA); denied != nil {
				t.Fatalf("deleting the plugin's own daemon pod is refused: %v", denied)
			}
			// An admin (or any other user) is not this policy's concern.
			if denied := admit(t, v, admission.Create, withSpec(daemon(), func(p *corev1.Pod) { p.Spec.NodeName = "node-b" }), &user.DefaultInfo{Name: "admin"}); denied != nil {
				t.Errorf("a request by another user is judged: %v", denied)
			}

			for what, tc := range map[string]struct {
				op     admission.Operation
				pod    *corev1.Pod
				user   user.Info
				denial string
			}{
				"create on another node": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) { p.Spec.NodeName = "node-b" }), onA,
					"the tessera kubelet plugin on node 'node-a' may not create MPS control daemon pods of node 'node-b'"},
				"create without a node": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) { p.Spec.NodeName = "" }), onA,
					"may not create MPS control daemon pods of no node"},
				"token not bound to a pod": {admission.Create, daemon(), &user.DefaultInfo{Name: serviceaccount.MakeUsername("tessera", "tessera-kubelet-plugin")},
					"must use a pod-bound service account token"},
				"not a daemon pod": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) { delete(p.Labels, mpsdaemon.LabelComponent) }), onA,
					"may create only MPS control daemon pods"},
				"no node label": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) { delete(p.Labels, mpsdaemon.LabelNode) }), onA,
					"needs the label gpu.tessera.dev/mps-node"},
				"another image": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) { p.Spec.Containers[0].Image = "docker.io/library/busybox:1.36" }), onA,
					"runs only the image " + cfg.Image},
				"another image in an init container": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.InitContainers = []corev1.Container{{Name: "x", Image: "docker.io/library/busybox:1.36"}}
				}), onA, "runs only the image"},
				"another command": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) { p.Spec.Containers[0].Command = []string{"/bin/sh", "-c", "cat /etc/shadow"} }), onA,
					"runs only /usr/bin/tessera-kubelet-plugin mps-daemon run"},
				"another subcommand": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) { p.Spec.Containers[0].Args = []string{"--help"} }), onA,
					"runs only /usr/bin/tessera-kubelet-plugin mps-daemon run"},
				// The whole argument list is pinned: a privileged daemon
				// pointed at another driver root would run any host
				// binary named nvidia-cuda-mps-control.
				"another driver root": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.Containers[0].Args = append(p.Spec.Containers[0].Args[:4:4], "--driver-root=/driver-root/tmp/evil")
				}), onA, "runs only /usr/bin/tessera-kubelet-plugin mps-daemon run --gpu=GPU-0f5e6a2c-1111-2222-3333-444455556666"},
				"an extra argument": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.Containers[0].Args = append(p.Spec.Containers[0].Args, "--fake")
				}), onA, "(spec.containers[].command and args"},
				// On a real node the last is --shm-tmpfs: a daemon without it
				// would serve clients from a plain directory after a reboot.
				"without the last argument": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.Containers[0].Args = p.Spec.Containers[0].Args[:len(p.Spec.Containers[0].Args)-1]
				}), onA, "(spec.containers[].command and args"},
				"another GPU than annotated": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.Containers[0].Args[2] = "--gpu=GPU-other"
				}), onA, "(spec.containers[].command and args"},
				"a writable driver root or propagation": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					for i := range p.Spec.Containers[0].VolumeMounts {
						m := &p.Spec.Containers[0].VolumeMounts[i]
						m.ReadOnly = false
						if cfg.Mock {
							// No driver root on mock nodes: propagation is
							// refused all the same.
							m.MountPropagation = ptr.To(corev1.MountPropagationBidirectional)
						}
					}
				}), onA, "mounts the driver root read-only and propagates no mounts"},
				"postStart hook": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.Containers[0].Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/sh", "-c", "id"}}}}
				}), onA, "has no lifecycle hooks"},
				"exec probe of another program": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.Containers[0].LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/sh", "-c", "id"}}}}
				}), onA, "exec probes run only"},
				"host network": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) { p.Spec.HostNetwork = true }), onA,
					"may not use the host's network"},
				"host IPC": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) { p.Spec.HostIPC = true }), onA,
					"may not use the host's network or IPC"},
				"service account token": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = nil }), onA,
					"spec.automountServiceAccountToken to false"},
				"another service account": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) { p.Spec.ServiceAccountName = "tessera-webhook" }), onA,
					"default service account"},
				"hostPath /etc": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) { addHostPath(p, "/etc") }), onA,
					"etc hostPath /etc"},
				"hostPath out of the MPS root with ..": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) { addHostPath(p, root+"/../../../../etc") }), onA,
					"(its GPU's and trust domain's directories under " + filepath.Clean(root) + "/)"},
				"hostPath beside the MPS root": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) { addHostPath(p, filepath.Clean(root)+"-other") }), onA,
					"may mount only the emptyDir state and hostPath volumes pipe, shm and log"},
				// Only the daemon's own directories, exactly: a tenant can
				// plant a symbolic link in its domain's shm (mounted
				// read-write into its containers), which the kubelet follows.
				"pipe below a tenant's shm": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					setHostPath(p, "pipe", filepath.Join(root, "GPU-0f5e6a2c-1111-2222-3333-444455556666/domains/team-a/shm/x"))
				}), onA, "(spec.volumes: pipe hostPath " + filepath.Join(root, "GPU-0f5e6a2c-1111-2222-3333-444455556666/domains/team-a/shm/x") + ")"},
				"pipe in a directory sharing the MPS root's prefix": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					setHostPath(p, "pipe", filepath.Clean(root)+"-evil/GPU-0f5e6a2c-1111-2222-3333-444455556666/domains/team-a/pipe")
				}), onA, "(spec.volumes: pipe hostPath " + filepath.Clean(root) + "-evil/"},
				"the MPS root itself": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) { setHostPath(p, "log", filepath.Clean(root)) }), onA,
					"(spec.volumes: log hostPath " + filepath.Clean(root) + ")"},
				"another GPU's pipe": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					setHostPath(p, "pipe", filepath.Join(root, "GPU-99999999-1111-2222-3333-444455556666/domains/team-a/pipe"))
				}), onA, "(spec.volumes: pipe hostPath " + filepath.Join(root, "GPU-99999999")},
				"another domain's shm": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					setHostPath(p, "shm", filepath.Join(root, "GPU-0f5e6a2c-1111-2222-3333-444455556666/domains/team-b/shm"))
				}), onA, "(spec.volumes: shm hostPath "},
				"the log directory as the pipe": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					setHostPath(p, "pipe", filepath.Join(root, "GPU-0f5e6a2c-1111-2222-3333-444455556666/domains/team-a/log"))
				}), onA, "(spec.volumes: pipe hostPath "},
				"a domain annotation climbing out": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Annotations[mpsdaemon.AnnotationDomain] = "team-a/shm/x"
					setHostPath(p, "pipe", filepath.Join(root, "GPU-0f5e6a2c-1111-2222-3333-444455556666/domains/team-a/shm/x/pipe"))
				}), onA, "annotation gpu.tessera.dev/mps-domain, a namespace name"},
				"the shm volume at the pipe with a subPath": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					for i := range p.Spec.Containers[0].VolumeMounts {
						if m := &p.Spec.Containers[0].VolumeMounts[i]; m.Name == "pipe" {
							m.Name, m.SubPath = "shm", "x"
						}
					}
				}), onA, "mounts each of its volumes only where the plugin does, without subPath"},
				"an extra emptyDir": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
				}), onA, "(spec.volumes: scratch)"},
				"secret volume": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "tessera-webhook-tls"}}})
				}), onA, "(spec.volumes: tls)"},
				"env from a secret": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "KEY", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "tessera-webhook-tls"}, Key: "tls.key"}}}}
				}), onA, "sets no environment variables, neither values nor from Secrets"},
				"envFrom": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "tessera-webhook-tls"}}}}
				}), onA, "sets no environment variables, neither values nor from Secrets"},
				// The pinned binary and arguments do not bound a privileged,
				// hostPID daemon whose dynamic loader runs the token
				// holder's library: Config.Pod sets no environment at all.
				"LD_PRELOAD": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "LD_PRELOAD", Value: "/dev/shm/x.so"}}
				}), onA, "sets no environment variables, neither values nor from Secrets, ConfigMaps or fields: the plugin sets none (spec.containers[].env: LD_PRELOAD; envFrom)"},
				"LD_LIBRARY_PATH": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "LD_LIBRARY_PATH", Value: "/dev/shm"}}
				}), onA, "(spec.containers[].env: LD_LIBRARY_PATH; envFrom)"},
				"runtimeClassName": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) { p.Spec.RuntimeClassName = ptr.To("nvidia") }), onA,
					"runs in the node's default runtime"},
				"hostPort": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 10250, HostPort: 10250}}
				}), onA, "opens no host port"},
				"workingDir": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) { p.Spec.Containers[0].WorkingDir = "/dev/shm" }), onA,
					"keeps its image's working directory"},
				"a second daemon container": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					c := *p.Spec.Containers[0].DeepCopy()
					c.Name = "second"
					p.Spec.Containers = append(p.Spec.Containers, c)
				}), onA, "has exactly one container and no init or ephemeral containers"},
				"the daemon as an init container": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					c := *p.Spec.Containers[0].DeepCopy()
					c.Name, c.RestartPolicy = "sidecar", ptr.To(corev1.ContainerRestartPolicyAlways)
					p.Spec.InitContainers = []corev1.Container{c}
				}), onA, "has exactly one container and no init or ephemeral containers"},
				"an ephemeral container": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", Image: cfg.Image}}}
				}), onA, "no init or ephemeral containers"},
				"a container's resource claim": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
					p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("someone-elses")}}
				}), onA, "opens no host port, resource claim or block device"},
				"a pod resource claim": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("someone-elses")}}
				}), onA, "claims no resources"},
				"an added capability": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.Containers[0].SecurityContext.Capabilities = &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}
				}), onA, "sets only the securityContext the plugin does"},
				"seccomp unconfined": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.Containers[0].SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
				}), onA, "sets only the securityContext the plugin does"},
				"AppArmor unconfined": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.Containers[0].SecurityContext.AppArmorProfile = &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeUnconfined}
				}), onA, "sets only the securityContext the plugin does"},
				"another user": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) { p.Spec.Containers[0].SecurityContext.RunAsUser = ptr.To[int64](1000) }), onA,
					"sets only the securityContext the plugin does"},
				"an unmasked /proc": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.Containers[0].SecurityContext.ProcMount = ptr.To(corev1.UnmaskedProcMount)
				}), onA, "procMount other than Default"},
				"a pod sysctl": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.SecurityContext = &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "kernel.core_pattern", Value: "|/dev/shm/x"}}}
				}), onA, "sets no pod securityContext"},
				"pod SELinux options": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.SecurityContext = &corev1.PodSecurityContext{SELinuxOptions: &corev1.SELinuxOptions{Type: "spc_t"}}
				}), onA, "sets no pod securityContext"},
				"another pull secret": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.ImagePullSecrets = append(p.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: "tessera-webhook-tls"})
				}), onA, "only the chart's imagePullSecrets"},
				// Mock GPUs need neither: their daemon pod is unprivileged.
				"a mock daemon privileged": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) {
					p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
				}), onA, "privileged on real nodes"},
				"a mock daemon in the host's PID namespace": {admission.Create, withSpec(daemon(), func(p *corev1.Pod) { p.Spec.HostPID = true }), onA,
					"of mock GPUs may not use the host's PID namespace"},
				"delete another node's daemon": {admission.Delete, withSpec(daemon(), func(p *corev1.Pod) { p.Spec.NodeName = "node-b" }), onA,
					"may not delete MPS control daemon pods of node 'node-b'"},
				"delete the webhook": {admission.Delete, &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: "tessera-webhook-7d9f", Namespace: "tessera", Labels: map[string]string{"app.kubernetes.io/component": "webhook"}},
					Spec:       corev1.PodSpec{NodeName: "node-a"},
				}, onA, "may delete only MPS control daemon pods (label app.kubernetes.io/component=mps-control-daemon), not pod tessera-webhook-7d9f"},
			} {
				if (what == "a mock daemon privileged" || what == "a mock daemon in the host's PID namespace") && !cfg.Mock {
					continue
				}
				denied := admit(t, v, tc.op, tc.pod, tc.user)
				if !strings.Contains(strings.Join(denied, "\n"), tc.denial) {
					t.Errorf("%s: denials %q; want one with %q", what, denied, tc.denial)
				}
			}
		})
	}

	t.Run("disabled", func(t *testing.T) {
		out, err := helm(t, "template", "tessera", chartDir, "--namespace", "tessera", "--kube-version", kubeVersion, "--set", "kubeletPlugin.mps.admissionPolicy=false")
		if err == nil || !strings.Contains(out+err.Error(), "kubeletPlugin.mps.iUnderstandAnyNodeCanCreatePrivilegedPods=true") {
			t.Fatalf("rendered without the MPS pod policy and without the acknowledgement: %v\n%.500s", err, out)
		}
		for _, o := range objects(t, render(t, "--set", "kubeletPlugin.mps.admissionPolicy=false", "--set", "kubeletPlugin.mps.iUnderstandAnyNodeCanCreatePrivilegedPods=true")) {
			if strings.HasSuffix(o.GetName(), "-mps-pods") {
				t.Errorf("kubeletPlugin.mps.admissionPolicy=false renders %s %s", o.GetKind(), o.GetName())
			}
		}
	})
}

func withSpec(p *corev1.Pod, change func(*corev1.Pod)) *corev1.Pod {
	change(p)
	return p
}

// setHostPath points the pod's hostPath volume name at path.
func setHostPath(p *corev1.Pod, name, path string) {
	for i := range p.Spec.Volumes {
		if v := &p.Spec.Volumes[i]; v.Name == name {
			v.HostPath.Path = path
			return
		}
	}
	panic("no volume " + name)
}

func addHostPath(p *corev1.Pod, path string) {
	name := strings.Trim(filepath.Base(path), ".")
	if name == "" {
		name = "host"
	}
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}}})
}

// TestMPSResourcesArgs: kubeletPlugin.mps.resources reaches the plugin as
// --mps-requests and --mps-limits, which the plugin parses into the daemon
// pods' resources.
func TestMPSResourcesArgs(t *testing.T) {
	for name, tc := range map[string]struct {
		set  []string
		want corev1.ResourceRequirements
	}{
		"default": {nil, mpsdaemon.DefaultResources()},
		"guaranteed": {[]string{"--set", "kubeletPlugin.mps.resources.requests.cpu=1,kubeletPlugin.mps.resources.requests.memory=1Gi,kubeletPlugin.mps.resources.limits.cpu=1,kubeletPlugin.mps.resources.limits.memory=1Gi"},
			corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")},
				Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")},
			}},
		"none (the plugin's default)": {[]string{"--set", "kubeletPlugin.mps.resources=null"}, mpsdaemon.DefaultResources()},
	} {
		ds := find[appsv1.DaemonSet](t, objects(t, render(t, tc.set...)), "DaemonSet", "tessera-kubelet-plugin")
		var got corev1.ResourceRequirements
		for _, a := range ds.Spec.Template.Spec.Containers[0].Args {
			for flag, list := range map[string]*corev1.ResourceList{"--mps-requests=": &got.Requests, "--mps-limits=": &got.Limits} {
				v, ok := strings.CutPrefix(a, flag)
				if !ok {
					continue
				}
				pairs := map[string]string{}
				for _, kv := range strings.Split(v, ",") {
					k, q, _ := strings.Cut(kv, "=")
					pairs[k] = q
				}
				l, err := mpsdaemon.ParseResourceList(pairs)
				if err != nil {
					t.Fatalf("%s: %s: %v", name, a, err)
				}
				*list = l
			}
		}
		if len(got.Requests) == 0 && len(got.Limits) == 0 {
			got = mpsdaemon.DefaultResources()
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s: daemon pod resources from the plugin's args (-want +got):\n%s", name, diff)
		}
	}
}
