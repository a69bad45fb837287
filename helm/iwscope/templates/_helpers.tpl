{{/*
Names. fullname is truncated to 40 characters so that "<fullname>-<component>-<suffix>"
stays inside the 63-character limit of Kubernetes names and labels.
*/}}
{{- define "iwscope.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "iwscope.fullname" -}}
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

{{- define "iwscope.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels shared by every object; call with (dict "root" $ "component" "api"). */}}
{{- define "iwscope.labels" -}}
helm.sh/chart: {{ include "iwscope.chart" .root }}
{{ include "iwscope.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: iwscope
{{- end -}}

{{- define "iwscope.selectorLabels" -}}
app.kubernetes.io/name: {{ include "iwscope.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "iwscope.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "iwscope.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "iwscope.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The Secret holding DATABASE_URL, REDIS_URL and the bootstrap tokens. */}}
{{- define "iwscope.secretName" -}}
{{- if .Values.secret.existingSecret -}}
{{- .Values.secret.existingSecret -}}
{{- else -}}
{{- printf "%s-secrets" (include "iwscope.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "iwscope.postgresql.host" -}}
{{- printf "%s-postgresql" (include "iwscope.fullname" .) -}}
{{- end -}}

{{- define "iwscope.redis.host" -}}
{{- printf "%s-redis" (include "iwscope.fullname" .) -}}
{{- end -}}

{{/*
Passwords of the built-in PostgreSQL / Redis: the value if set, else the one already stored
in the release's Secret (so upgrades keep it), else a random one. The result is memoised in
.Values so that every template of one render sees the same password.
*/}}
{{- define "iwscope.builtinPassword" -}}
{{- $root := .root -}}
{{- $section := index $root.Values .service -}}
{{- if not $section.builtin.password -}}
{{- $existing := lookup "v1" "Secret" $root.Release.Namespace (printf "%s-secrets" (include "iwscope.fullname" $root)) -}}
{{- $stored := "" -}}
{{- if and $existing $existing.data -}}
{{- $stored = index $existing.data .key | default "" | b64dec -}}
{{- end -}}
{{- $_ := set $section.builtin "password" (default (randAlphaNum 32) $stored) -}}
{{- end -}}
{{- $section.builtin.password -}}
{{- end -}}

{{- define "iwscope.databaseUrl" -}}
{{- if .Values.postgresql.builtin.enabled -}}
{{- $b := .Values.postgresql.builtin -}}
{{- printf "postgresql+psycopg://%s:%s@%s:5432/%s" $b.username (include "iwscope.builtinPassword" (dict "root" . "service" "postgresql" "key" .Values.secret.keys.postgresPassword)) (include "iwscope.postgresql.host" .) $b.database -}}
{{- else -}}
{{- required "postgresql.url is required when postgresql.builtin.enabled is false and secret.existingSecret is empty (e.g. postgresql+psycopg://iwscope:PASSWORD@db.example.net:5432/iwscope)" .Values.postgresql.url -}}
{{- end -}}
{{- end -}}

{{- define "iwscope.redisUrl" -}}
{{- if .Values.redis.builtin.enabled -}}
{{- printf "redis://:%s@%s:6379/0" (include "iwscope.builtinPassword" (dict "root" . "service" "redis" "key" .Values.secret.keys.redisPassword)) (include "iwscope.redis.host" .) -}}
{{- else -}}
{{- required "redis.url is required when redis.builtin.enabled is false and secret.existingSecret is empty (e.g. redis://:PASSWORD@redis.example.net:6379/0)" .Values.redis.url -}}
{{- end -}}
{{- end -}}

{{/* Pod-level security context shared by the iwscope pods. */}}
{{- define "iwscope.podSecurityContext" -}}
{{- toYaml .Values.podSecurityContext -}}
{{- end -}}

{{/* Container-level security context shared by every iwscope container (incl. init). */}}
{{- define "iwscope.containerSecurityContext" -}}
{{- toYaml .Values.securityContext -}}
{{- end -}}

{{/*
Environment of the iwscope containers: non-secret settings from the ConfigMap, secrets by
reference. Call with (dict "root" $ "tokens" true) to include the bootstrap tokens (API only).
*/}}
{{- define "iwscope.env" -}}
{{- $root := .root -}}
{{- $keys := $root.Values.secret.keys -}}
envFrom:
  - configMapRef:
      name: {{ include "iwscope.fullname" $root }}-config
env:
  - name: DATABASE_URL
    valueFrom:
      secretKeyRef:
        name: {{ include "iwscope.secretName" $root }}
        key: {{ $keys.databaseUrl }}
  - name: REDIS_URL
    valueFrom:
      secretKeyRef:
        name: {{ include "iwscope.secretName" $root }}
        key: {{ $keys.redisUrl }}
  {{- if .tokens }}
  - name: IWSCOPE_ADMIN_TOKEN
    valueFrom:
      secretKeyRef:
        name: {{ include "iwscope.secretName" $root }}
        key: {{ $keys.adminToken }}
        optional: true
  - name: IWSCOPE_ENROLL_TOKEN
    valueFrom:
      secretKeyRef:
        name: {{ include "iwscope.secretName" $root }}
        key: {{ $keys.enrollToken }}
        optional: true
  {{- end }}
{{- end -}}

{{/*
Init container that blocks until `iwscope db check` says the schema is at head, i.e. until
the migration Job has run. Replicated pods never migrate themselves.
*/}}
{{- define "iwscope.waitForSchema" -}}
- name: wait-for-schema
  image: {{ include "iwscope.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    - sh
    - -c
    - >-
      until iwscope db check; do
      echo "waiting for the migration Job to bring the database schema to head";
      sleep {{ .Values.migrations.waitIntervalSeconds }};
      done
  {{- include "iwscope.env" (dict "root" .) | nindent 2 }}
  securityContext:
    {{- include "iwscope.containerSecurityContext" . | nindent 4 }}
  resources:
    {{- toYaml .Values.migrations.resources | nindent 4 }}
  volumeMounts:
    - name: tmp
      mountPath: /tmp
{{- end -}}

{{/* Pod annotations that roll the pods when configuration or secrets change. */}}
{{- define "iwscope.checksums" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- if .Values.secret.existingSecret }}
checksum/secret: {{ printf "%s/%s" .Values.secret.existingSecret (toJson .Values.secret.keys) | sha256sum }}
{{- else }}
checksum/secret: {{ include (print .Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end }}
{{- end -}}

{{/* The pieces every iwscope pod spec shares. */}}
{{- define "iwscope.podCommon" -}}
serviceAccountName: {{ include "iwscope.serviceAccountName" . }}
automountServiceAccountToken: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- include "iwscope.podSecurityContext" . | nindent 2 }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Security context of the built-in PostgreSQL / Redis containers (their images' users). */}}
{{- define "iwscope.builtinContainerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The analysis copy's volume mount and volume (API, worker, dashboard), when a claim is set. */}}
{{- define "iwscope.analysisCopyMount" -}}
{{- if .Values.analysisCopy.existingClaim }}
- name: analysis-copy
  mountPath: {{ .Values.analysisCopy.mountPath }}
{{- end }}
{{- end -}}

{{- define "iwscope.analysisCopyVolume" -}}
{{- if .Values.analysisCopy.existingClaim }}
- name: analysis-copy
  persistentVolumeClaim:
    claimName: {{ .Values.analysisCopy.existingClaim }}
{{- end }}
{{- end -}}
