{{- define "proof-agent.labels" -}}
app.kubernetes.io/name: proof-agent
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "proof-agent.selector" -}}
app.kubernetes.io/name: proof-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
