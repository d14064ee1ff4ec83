{{/* The release's base name for every object. */}}
{{- define "tessera.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tessera.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tessera.labels" -}}
app.kubernetes.io/name: {{ include "tessera.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "tessera.pluginName" -}}
{{- printf "%s-kubelet-plugin" (include "tessera.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tessera.webhookName" -}}
{{- printf "%s-webhook" (include "tessera.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tessera.pluginSelector" -}}
app.kubernetes.io/name: {{ include "tessera.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: kubelet-plugin
{{- end -}}

{{- define "tessera.webhookSelector" -}}
app.kubernetes.io/name: {{ include "tessera.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end -}}

{{/* The driver's name; fixed, since the plugin, the classes and GpuConfig's API group all use it. */}}
{{- define "tessera.driver" -}}gpu.tessera.dev{{- end -}}

{{- define "tessera.pluginDataDir" -}}
{{- printf "%s/plugins/%s" (trimSuffix "/" .Values.kubeletPlugin.kubeletDir) (include "tessera.driver" .) -}}
{{- end -}}

{{/* An image reference: repository@digest when image.digest is set (the tag is
then ignored: a digest names the bytes, a tag can move), else
repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "tessera.image" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- $tag := default .root.Chart.AppVersion .image.tag -}}
{{- printf "%s:%s" .image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* A DeviceClass's config list from a values map of GpuConfig fields. */}}
{{- define "tessera.classConfig" -}}
{{- if .config }}
config:
- opaque:
    driver: gpu.tessera.dev
    parameters:
      {{- toYaml (merge (dict "apiVersion" "gpu.tessera.dev/v1alpha1" "kind" "GpuConfig") .config) | nindent 6 }}
{{- end }}
{{- end -}}

{{/* The webhook's serving-certificate DNS names: the Service's, and any extra. */}}
{{- define "tessera.webhookDNSNames" -}}
{{- $svc := include "tessera.webhookName" . -}}
{{- $names := list $svc (printf "%s.%s" $svc .Release.Namespace) (printf "%s.%s.svc" $svc .Release.Namespace) -}}
{{- toJson (concat $names .Values.webhook.tls.dnsNames) -}}
{{- end -}}

{{/*
The webhook's self-signed CA and serving certificate (base64 PEM), as YAML
{ca, cert, key}: the existing Secret's when there is one (so upgrades keep
them), else freshly generated. Rendered once per template that includes it;
helm renders the same lookup result into each, and on install, where nothing is
found, webhook-configuration.yaml holds both the Secret and the caBundle.
*/}}
{{- define "tessera.webhookTLS" -}}
{{- $w := .Values.webhook -}}
{{- if not $w.tls.certManager.enabled -}}
{{- $name := include "tessera.webhookName" . -}}
{{- $secret := lookup "v1" "Secret" .Release.Namespace (printf "%s-tls" $name) -}}
{{- if and $secret (hasKey (default dict $secret.data) "ca.crt") -}}
ca: {{ index $secret.data "ca.crt" }}
cert: {{ index $secret.data "tls.crt" }}
key: {{ index $secret.data "tls.key" }}
{{- else -}}
{{- $ca := genCA (printf "%s-ca" $name) (int $w.tls.validityDays) -}}
{{- $dnsNames := include "tessera.webhookDNSNames" . | fromJsonArray -}}
{{- $cert := genSignedCert (printf "%s.%s.svc" $name .Release.Namespace) $w.tls.ipAddresses $dnsNames (int $w.tls.validityDays) $ca -}}
ca: {{ $ca.Cert | b64enc }}
cert: {{ $cert.Cert | b64enc }}
key: {{ $cert.Key | b64enc }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The budget webhook's namespaceSelector: budgets.namespaceSelector, with the
namespaces that must never wait on it excluded by name (kube-system,
kube-public, kube-node-lease and the release's).
*/}}
{{- define "tessera.budgetNamespaceSelector" -}}
{{- $b := .Values.budgets | default dict -}}
{{- $sel := deepCopy ($b.namespaceSelector | default dict) -}}
{{- if and (not $sel.matchLabels) (not $sel.matchExpressions) -}}
{{- fail "budgets.namespaceSelector selects every namespace: give it matchLabels or matchExpressions (by default gpu.tessera.dev/budgets: enforced)" -}}
{{- end -}}
{{- $never := list "kube-system" "kube-public" "kube-node-lease" .Release.Namespace | uniq -}}
{{- $exprs := append ($sel.matchExpressions | default list) (dict "key" "kubernetes.io/metadata.name" "operator" "NotIn" "values" $never) -}}
{{- $_ := set $sel "matchExpressions" $exprs -}}
{{- toYaml $sel -}}
{{- end -}}
