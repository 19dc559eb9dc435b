{{/* The chart's name. */}}
{{- define "mcp-gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name, for resource names. */}}
{{- define "mcp-gateway.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels on every resource. */}}
{{- define "mcp-gateway.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "mcp-gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select the pods. */}}
{{- define "mcp-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mcp-gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The service account's name. */}}
{{- define "mcp-gateway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "mcp-gateway.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding the database URL and admin token, if any. */}}
{{- define "mcp-gateway.secretName" -}}
{{- if .Values.existingSecret }}
{{- .Values.existingSecret }}
{{- else if .Values.secret.create }}
{{- include "mcp-gateway.fullname" . }}
{{- end }}
{{- end }}

{{/* Cluster mode's values are consistent; fails the render, naming the values, otherwise. */}}
{{- define "mcp-gateway.checkCluster" -}}
{{- $c := .Values.cluster }}
{{- $fromValues := or $c.redisUrl $c.clusterSecret }}
{{- if not $c.enabled }}
{{- if $fromValues }}
{{- fail "cluster.redisUrl and cluster.clusterSecret are used only with cluster.enabled=true" }}
{{- end }}
{{- else if .Values.existingSecret }}
{{- if $fromValues }}
{{- fail "with existingSecret, put MCP_GATEWAY_REDIS_URL and MCP_GATEWAY_CLUSTER_SECRET in that Secret and leave cluster.redisUrl and cluster.clusterSecret empty" }}
{{- end }}
{{- else if .Values.secret.create }}
{{- if not (and $c.redisUrl $c.clusterSecret) }}
{{- fail "cluster.enabled with secret.create needs cluster.redisUrl and cluster.clusterSecret" }}
{{- end }}
{{- else }}
{{- fail "cluster.enabled needs a Secret: existingSecret (with MCP_GATEWAY_REDIS_URL and MCP_GATEWAY_CLUSTER_SECRET), or secret.create with cluster.redisUrl and cluster.clusterSecret" }}
{{- end }}
{{- end }}
