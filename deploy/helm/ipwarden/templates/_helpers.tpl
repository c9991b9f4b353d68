{{/*
The objects' name: fullnameOverride, else the release name when it contains "ipwarden", else
"<release>-ipwarden"; at most 63 characters (a DNS label).
*/}}
{{- define "ipwarden.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The labels that select the DaemonSet's pods (the DaemonSet, the Service, the ServiceMonitor). */}}
{{- define "ipwarden.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node-agent
{{- end -}}

{{/* The labels of every object. */}}
{{- define "ipwarden.labels" -}}
{{ include "ipwarden.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* The image reference: repository@digest when a digest is set, else repository:tag (tag default: appVersion). */}}
{{- define "ipwarden.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* unix:// + the runtime socket: --runtime-endpoint and CONTAINER_RUNTIME_ENDPOINT. */}}
{{- define "ipwarden.runtimeEndpoint" -}}
{{- printf "unix://%s" .Values.runtime.socket -}}
{{- end -}}

{{/* The volume name of the runtime socket's directory: its path as a DNS label (/run/containerd → run-containerd). */}}
{{- define "ipwarden.runtimeVolume" -}}
{{- dir .Values.runtime.socket | trimPrefix "/" | replace "/" "-" | replace "." "-" | replace "_" "-" | lower | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* HOST:PORT of the metrics listener (an IPv6 host in brackets); 127.0.0.1 when metrics are off. */}}
{{- define "ipwarden.metricsAddress" -}}
{{- $host := ternary (toString .Values.metrics.host) "127.0.0.1" .Values.metrics.enabled -}}
{{- if contains ":" $host -}}
{{- printf "[%s]:%d" $host (int .Values.metrics.port) -}}
{{- else -}}
{{- printf "%s:%d" $host (int .Values.metrics.port) -}}
{{- end -}}
{{- end -}}

{{/* Where the pool TLS Secret is mounted in the daemon container (fixed). */}}
{{- define "ipwarden.etcdTlsDir" -}}
/etc/ipwarden/etcd-tls
{{- end -}}

{{/* Where the pool credentials Secret's key is mounted in the daemon container, as one file (fixed). */}}
{{- define "ipwarden.etcdCredentialsFile" -}}
/etc/ipwarden/etcd-credentials.json
{{- end -}}

{{/*
The default root of the offline pool journals (`ipwarden daemon --pool-journal-dir`, src/pool/journal.ts
DEFAULT_POOL_JOURNAL_ROOT), which the standalone plugin also reads on the node. The chart keeps the
default, so the standalone sees the daemon's journal.
*/}}
{{- define "ipwarden.poolJournalDir" -}}
/var/lib/cni/networks/.ipwarden-pool-offline
{{- end -}}

{{/* "true" when the journal root is not inside the dataDir mount and needs a hostPath volume of its own. */}}
{{- define "ipwarden.poolJournalVolume" -}}
{{- if not (hasPrefix (printf "%s/" .Values.dataDir) (printf "%s/" (include "ipwarden.poolJournalDir" .))) -}}true{{- end -}}
{{- end -}}

{{/* The monitoring.coreos.com/v1 API is served (or passed to helm template with --api-versions). */}}
{{- define "ipwarden.hasMonitoringApi" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" -}}true{{- end -}}
{{- end -}}

{{/*
Refuse values the daemon or the CNI configuration would refuse later, with the same rule:
paths absolute, the pool endpoints as ipam.pool.etcd.endpoints takes them (src/ipam/pool-config.ts) and of one scheme, https with a CA, a TLS Secret only with https,
a credentials Secret only with endpoints, a dataDir outside the offline journal's directory.
*/}}
{{- define "ipwarden.validate" -}}
{{- range $k, $p := dict "runtime.socket" .Values.runtime.socket "dataDir" .Values.dataDir "cni.binDir" .Values.cni.binDir "cni.confDir" .Values.cni.confDir -}}
{{- if not (regexMatch "^/[^\\x00]*[^/]$" $p) -}}
{{- fail (printf "%s must be an absolute path not ending in /, got %q" $k $p) -}}
{{- end -}}
{{- if regexMatch "(^|/)\\.\\.?(/|$)" $p -}}
{{- fail (printf "%s must not contain \".\" or \"..\" components, got %q" $k $p) -}}
{{- end -}}
{{- end -}}
{{- $eps := .Values.pools.etcd.endpoints -}}
{{- $https := 0 -}}
{{- range $i, $e := $eps -}}
{{- if not (regexMatch "^https?://(\\[[0-9a-fA-F:.]+\\]|[A-Za-z0-9.-]+):[0-9]{1,5}$" $e) -}}
{{- fail (printf "pools.etcd.endpoints[%d] must be http://HOST:PORT or https://HOST:PORT, got %q" $i $e) -}}
{{- end -}}
{{- if hasPrefix "https://" $e -}}{{- $https = add1 $https -}}{{- end -}}
{{- end -}}
{{- if and (gt $https 0) (lt $https (len $eps)) -}}
{{- fail "pools.etcd.endpoints mix http:// and https://" -}}
{{- end -}}
{{- if and (gt $https 0) (not .Values.pools.etcd.tls.secretName) -}}
{{- fail "pools.etcd.tls.secretName is required with https:// endpoints (a Secret with ca.crt)" -}}
{{- end -}}
{{- if and .Values.pools.etcd.tls.secretName (eq $https 0) -}}
{{- fail "pools.etcd.tls.secretName is given but the endpoints are not https://" -}}
{{- end -}}
{{- if hasPrefix (printf "%s/" (include "ipwarden.poolJournalDir" .)) .Values.dataDir -}}
{{- fail (printf "dataDir must not be inside %s (the offline pool journal's directory), got %q" (include "ipwarden.poolJournalDir" .) .Values.dataDir) -}}
{{- end -}}
{{- if and .Values.pools.etcd.credentials.secretName (eq (len $eps) 0) -}}
{{- fail "pools.etcd.credentials.secretName is given but pools.etcd.endpoints is empty" -}}
{{- end -}}
{{- if and .Values.serviceMonitor.enabled (not .Values.metrics.enabled) -}}
{{- fail "serviceMonitor.enabled needs metrics.enabled (the ServiceMonitor scrapes the metrics Service)" -}}
{{- end -}}
{{- end -}}
