{{/* Labels every object of the release carries. */}}
{{- define "strata.labels" -}}
app.kubernetes.io/name: strata
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "strata.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The downward API: the node's name and address, the Pod's namespace and IP. */}}
{{- define "strata.env" -}}
- name: NODE_NAME
  valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
- name: HOST_IP
  valueFrom: {fieldRef: {fieldPath: status.hostIP}}
- name: POD_IP
  valueFrom: {fieldRef: {fieldPath: status.podIP}}
- name: POD_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
{{- include "strata.apiEnv" . }}
- name: STRATA_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: STRATA_LOG_JSON
  value: {{ .Values.logJSON | quote }}
{{- end }}

{{/* The path of a disk entry, PATH or NAME=PATH. */}}
{{- define "strata.diskPath" -}}
{{ regexReplaceAll "^[^=/]+=" . "" }}
{{- end }}

{{/*
A node name as a label value (at most 63 characters): the name itself, or
its start and a checksum when it is longer.
*/}}
{{- define "strata.nodeKey" -}}
{{- if le (len .) 63 -}}
{{ . }}
{{- else -}}
{{ printf "%s-%s" (trunc 52 .) (adler32sum .) }}
{{- end -}}
{{- end }}

{{/*
The node sets, as YAML: one for the nodes that disks.perNode and nodeDirs
do not list (key ""), one per listed node, each with its disks, hostDir
and kubeletRoot. The manager, the instance manager and the CSI node plugin
get a DaemonSet per set, so each node's Pods mount its own directories.
*/}}
{{- define "strata.diskSets" -}}
{{- $reserved := list "instance-manager" "tls" "run" "csi" -}}
{{- $listed := concat (keys .Values.disks.perNode) (keys .Values.nodeDirs) | uniq | sortAlpha -}}
{{- $sets := list (dict "key" "" "suffix" "" "paths" .Values.disks.default "except" $listed
    "hostDir" .Values.hostDir "kubeletRoot" .Values.kubeletRoot) -}}
{{- range $node := $listed -}}
{{- $dirs := get $.Values.nodeDirs $node | default dict -}}
{{- $paths := $.Values.disks.default -}}
{{- if hasKey $.Values.disks.perNode $node }}{{ $paths = get $.Values.disks.perNode $node }}{{ end -}}
{{- $sets = append $sets (dict "key" (include "strata.nodeKey" $node) "suffix" (printf "-%s" (include "strata.nodeKey" $node))
    "node" $node "paths" $paths "hostDir" ($dirs.hostDir | default $.Values.hostDir)
    "kubeletRoot" ($dirs.kubeletRoot | default $.Values.kubeletRoot)) -}}
{{- end -}}
{{- range $set := $sets -}}
{{- if not $set.paths }}{{ fail (printf "disks (%s): at least one disk" ($set.node | default "disks.default")) }}{{ end -}}
{{- range $set.paths -}}
{{- $p := printf "%s/" (include "strata.diskPath" . | trimSuffix "/") -}}
{{- range $reserved -}}
{{- $r := printf "%s/%s/" $set.hostDir . -}}
{{- if or (hasPrefix $p $r) (hasPrefix $r $p) -}}
{{- fail (printf "disk %s overlaps %s, which Strata keeps its own files in: put disks elsewhere" $p $r) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
sets: {{ toJson $sets }}
{{- end }}

{{/* Node affinity of a disk set: its node, or every node but the listed ones. */}}
{{- define "strata.diskSetAffinity" -}}
{{- if .node -}}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        - matchFields:
            - {key: metadata.name, operator: In, values: [{{ .node | quote }}]}
{{- else if .except -}}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        # One requirement per node: a node field selector takes one value.
        - matchFields:
            {{- range .except }}
            - {key: metadata.name, operator: NotIn, values: [{{ . | quote }}]}
            {{- end }}
{{- end }}
{{- end }}

{{/* hostPath volumes and mounts of a disk set's disks and the backup paths. */}}
{{- define "strata.diskVolumes" -}}
{{- range $i, $d := .paths }}
- name: disk-{{ $i }}
  hostPath: {path: {{ include "strata.diskPath" $d | quote }}, type: DirectoryOrCreate}
{{- end }}
{{- range $i, $p := .backupPaths }}
- name: backup-{{ $i }}
  hostPath: {path: {{ $p | quote }}, type: Directory}
{{- end }}
{{- end }}

{{/* Disks and backup paths appear at their host paths; a filesystem mounted
on the host later (a disk, an NFS export) shows through (HostToContainer). */}}
{{- define "strata.diskMounts" -}}
{{- range $i, $d := .paths }}
- name: disk-{{ $i }}
  mountPath: {{ include "strata.diskPath" $d | quote }}
  mountPropagation: HostToContainer
{{- end }}
{{- range $i, $p := .backupPaths }}
- name: backup-{{ $i }}
  mountPath: {{ $p | quote }}
  mountPropagation: HostToContainer
{{- end }}
{{- end }}

{{/* The credential Secrets the managers may read: the documented one first. */}}
{{- define "strata.backupSecrets" -}}
{{- $names := list "strata-backup-credentials" -}}
{{- with .Values.backupTarget.credentialSecret }}{{ $names = append $names . }}{{ end -}}
{{- $names = concat $names .Values.extraBackupCredentialSecrets | uniq -}}
{{ toJson $names }}
{{- end }}

{{/* The security context of the manager and the instance manager: root (their
host directories are root's), no capability, no escalation, read-only image. */}}
{{- /* A Pod's security context: the container runtime's default seccomp
profile for every container, and with nonRoot a user and group that are
not root (65532, as distroless images' "nonroot"), for the Pods that touch
no host directory. Privileged containers run unconfined whatever it says
(README "What runs"). */ -}}
{{- define "strata.podSecurity" -}}
securityContext:
  seccompProfile: {type: RuntimeDefault}
  {{- if .nonRoot }}
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  {{- end }}
{{- end }}

{{- define "strata.unprivileged" -}}
securityContext:
  privileged: false
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
{{- end }}

{{/* The API server address when the kubernetes Service is not routed
(values kubernetesAPI); nothing otherwise. */}}
{{- define "strata.apiEnv" -}}
{{- with .Values.kubernetesAPI.host }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ . | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ required "kubernetesAPI.port: required with kubernetesAPI.host" $.Values.kubernetesAPI.port | quote }}
{{- end }}
{{- end }}

{{- /* Where backup tools reach the SnapshotMetadata sidecar. */ -}}
{{- define "strata.snapshotMetadataAddress" -}}
{{- .Values.snapshotMetadata.address | default (printf "strata-snapshot-metadata.%s:443" .Release.Namespace) -}}
{{- end -}}
