{{/* Name of the chart, overridable with nameOverride. */}}
{{- define "rdmavisor.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Prefix of every object's name: the release name, with the chart name
appended unless the release name already holds it. Cluster-scoped objects
carry it too, so two releases do not collide.
*/}}
{{- define "rdmavisor.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 54 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 54 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Name of the operator's Deployment, ServiceAccount and RBAC objects. */}}
{{- define "rdmavisor.operatorName" -}}
{{- printf "%s-operator" (include "rdmavisor.fullname" .) -}}
{{- end -}}

{{/* The image of the operator and, unless an RDMAService names one, of the agents. */}}
{{- define "rdmavisor.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "rdmavisor.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rdmavisor.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Selector labels of the operator's pods. A Deployment selector is immutable: never change these. */}}
{{- define "rdmavisor.operatorSelectorLabels" -}}
{{ include "rdmavisor.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "rdmavisor.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "rdmavisor.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Labels of the operator's objects. */}}
{{- define "rdmavisor.operatorLabels" -}}
{{ include "rdmavisor.labels" . }}
app.kubernetes.io/component: operator
{{- end -}}
