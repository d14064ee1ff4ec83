package legacy

// The pods of each system's documentation, as the documentation writes them
// (only the kind of the gpushare StatefulSet is changed to a Pod's template;
// Koordinator's proposals show the resources block alone, put in a pod here).

// HAMi, examples/nvidia/default_use.yaml @4707fb02.
const hamiDefaultUse = `
apiVersion: v1
kind: Pod
metadata:
  name: gpu-pod
spec:
  containers:
    - name: ubuntu-container
      image: ubuntu:22.04
      command: ["bash", "-c", "sleep 86400"]
      resources:
        limits:
          nvidia.com/gpu: 1 # declare how many physical GPUs the pod needs
          nvidia.com/gpumem: 3000 # identifies 3000M GPU memory each physical GPU allocates to the pod （Optional,Integer）
          nvidia.com/gpucores: 30 # identifies 30% GPU GPU core each physical GPU allocates to the pod （Optional,Integer)
`

// HAMi, examples/nvidia/use_memory_fraction.yaml.
const hamiMemoryFraction = `
apiVersion: v1
kind: Pod
metadata:
  name: gpu-pod
spec:
  containers:
    - name: ubuntu-container
      image: ubuntu:18.04
      command: ["bash", "-c", "sleep 86400"]
      resources:
        limits:
          nvidia.com/gpu: 2 # declare how many physical GPUs the pod needs
          nvidia.com/gpumem-percentage: 50 # identifies 50% GPU memory each physical GPU allocates to the pod （Optional,Integer）
          nvidia.com/gpucores: 30 # identifies 30% GPU GPU core each physical GPU allocates to the pod （Optional,Integer)
`

// HAMi, examples/nvidia/use_exclusive_card.yaml.
const hamiExclusive = `
apiVersion: v1
kind: Pod
metadata:
  name: gpu-pod1
spec:
  containers:
    - name: ubuntu-container
      image: ubuntu:18.04
      command: ["bash", "-c", "sleep 86400"]
      resources:
        limits:
          nvidia.com/gpu: 2 # declare how many physical GPUs the pod needs
          nvidia.com/gpumem-percentage: 100 # identifies 100% GPU memory each physical GPU allocates to the pod （Optional,Integer）
          nvidia.com/gpucores: 100 # identifies 100% GPU GPU core each physical GPU allocates to the pod（Optional,Integer)
`

// HAMi, examples/nvidia/specify_card_type_to_use.yaml.
const hamiUseType = `
apiVersion: v1
kind: Pod
metadata:
  name: gpu-pod
  annotations:
    # You can run command: kubectl get node $node -o jsonpath='{.metadata.annotations.hami\.io/node-nvidia-register}' to get registered gpu info
    # The full GPU type name is like NVIDIA-NVIDIA A100, while the short name is like A100
    nvidia.com/use-gputype: "A100,V100" # Specify the card type for this job, use comma to separate, will launch job on specified card
    # In this example, we want to run this job on A100 or V100
spec:
  containers:
    - name: ubuntu-container
      image: ubuntu:18.04
      command: ["bash", "-c", "sleep 86400"]
      resources:
        limits:
          nvidia.com/gpu: 2 # declare how many physical GPUs the pod needs
`

// HAMi, examples/nvidia/specify_card_type_not_use.yaml.
const hamiNoUseType = `
apiVersion: v1
kind: Pod
metadata:
  name: gpu-pod
  annotations:
    nvidia.com/nouse-gputype: "1080,2080" # Specify the blacklist card type for this job, use comma to separate, will not launch job on specified card
spec:
  containers:
    - name: ubuntu-container
      image: ubuntu:18.04
      command: ["bash", "-c", "sleep 86400"]
      resources:
        limits:
          nvidia.com/gpu: 2 # declare how many physical GPUs the pod needs
`

// gpushare-scheduler-extender, docs/userguide.md (the StatefulSet's
// template) @c0b61411.
const gpushareUserGuide = `
apiVersion: v1
kind: Pod
metadata:
  labels:
    app: binpack-1
spec:
  containers:
  - name: binpack-1
    image: cheyang/gpu-player:v2
    resources:
      limits:
        # GiB
        aliyun.com/gpu-mem: 3
`

// Koordinator, 20220629-fine-grained-device-scheduling.md, "Apply
// koordinator.sh/gpu-core and koordinator.sh/gpu-memory-ratio separately".
const koordCoreRatio = `
apiVersion: v1
kind: Pod
metadata:
  name: koord
spec:
  containers:
  - name: main
    image: busybox
    resources:
      requests:
        koordinator.sh/gpu-core: "50"
        koordinator.sh/gpu-memory-ratio: "60"
        cpu: "4"
        memory: "8Gi"
`

// Koordinator, the same document, "Apply koordinator.sh/gpu-core and
// koordinator.sh/gpu-memory separately".
const koordCoreMemory = `
apiVersion: v1
kind: Pod
metadata:
  name: koord
spec:
  containers:
  - name: main
    image: busybox
    resources:
      requests:
        koordinator.sh/gpu-core: "60"
        koordinator.sh/gpu-memory: "4Gi"
        cpu: "4"
        memory: "8Gi"
`

// Koordinator, the same document, "Apply whole resources of GPU or part
// resources of GPU" (koordinator.sh/gpu: 50), and two whole GPUs as
// gpu-core and gpu-memory-ratio 200 (its "translates nvidia.com/gpu: 2").
const koordShorthand = `
apiVersion: v1
kind: Pod
metadata:
  name: koord
spec:
  containers:
  - name: half
    image: busybox
    resources:
      requests:
        koordinator.sh/gpu: "50"
        cpu: "4"
        memory: "8Gi"
  - name: two
    image: busybox
    resources:
      requests:
        koordinator.sh/gpu-core: "200"
        koordinator.sh/gpu-memory-ratio: "200"
`

// NVIDIA's device plugin, README ("Running GPU Jobs").
const devicePlugin = `
apiVersion: v1
kind: Pod
metadata:
  name: gpu-pod
spec:
  restartPolicy: Never
  containers:
    - name: cuda-container
      image: nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0
      resources:
        limits:
          nvidia.com/gpu: 1 # requesting 1 GPU
  tolerations:
  - key: nvidia.com/gpu
    operator: Exists
    effect: NoSchedule
`
