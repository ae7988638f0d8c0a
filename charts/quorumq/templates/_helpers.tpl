{{/* Names */}}
{{- define "quorumq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "quorumq.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "quorumq.headless" -}}{{ include "quorumq.fullname" . }}-nodes{{- end -}}
{{- define "quorumq.secretName" -}}{{ default (include "quorumq.fullname" .) .Values.auth.existingSecret }}{{- end -}}
{{- define "quorumq.operatorName" -}}{{ include "quorumq.fullname" . }}-operator{{- end -}}

{{- define "quorumq.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "quorumq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: quorumq
{{- end -}}

{{- define "quorumq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "quorumq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: broker
{{- end -}}

{{- define "quorumq.operatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "quorumq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "quorumq.image" -}}
{{- $tag := default .Chart.AppVersion .image.tag -}}
{{- if .image.digest -}}{{ .image.repository }}@{{ .image.digest }}{{- else -}}{{ .image.repository }}:{{ $tag }}{{- end -}}
{{- end -}}

{{/* Where the broker's own management API answers inside the pod. */}}
{{- define "quorumq.localMgmtUrl" -}}http://127.0.0.1:{{ .Values.ports.management }}{{- end -}}

{{- define "quorumq.watchNamespaces" -}}
{{- if .Values.operator.watchNamespaces -}}{{ join "," .Values.operator.watchNamespaces }}{{- else -}}{{ .Release.Namespace }}{{- end -}}
{{- end -}}
