# Shared by proof-prolog.sh and proof-epilog.sh (sourced, not run). Bash; no Python on the path
# a prolog runs with is assumed.

_proof_json_str() {
  # A JSON string: backslash and quote escaped, control characters dropped.
  local s
  s="$(printf '%s' "$1" | tr -d '\000-\037')"
  s="${s//\\/\\\\}"
  s="${s//\"/\\\"}"
  printf '"%s"' "$s"
}

_proof_expand_indices() {
  # "0,1,4-6" -> "0 1 4 5 6"; anything that is not a digit list or range is refused (empty).
  local out=() part a b
  local IFS=,
  for part in $1; do
    if [[ "$part" =~ ^[0-9]+$ ]]; then
      out+=("$part")
    elif [[ "$part" =~ ^([0-9]+)-([0-9]+)$ ]]; then
      a="${BASH_REMATCH[1]}"; b="${BASH_REMATCH[2]}"
      if (( b < a || b - a > 255 )); then return 1; fi
      for ((; a <= b; a++)); do out+=("$a"); done
    elif [[ -n "$part" ]]; then
      return 1
    fi
  done
  printf '%s\n' "${out[*]:-}"
}

_proof_cgroup_gpus() {
  # GPU indices from the job's cgroup v1 devices list: lines "c 195:N rwm" (N < 254; 254 is
  # nvidia-modeset, 255 nvidiactl).
  local root="${PROOF_CGROUP_ROOT:-/sys/fs/cgroup}" list minor out=()
  list="$root/devices/slurm/uid_${SLURM_JOB_UID:-}/job_${SLURM_JOB_ID}/devices.list"
  [ -r "$list" ] || return 1
  while read -r kind dev _perm; do
    [ "$kind" = c ] || continue
    case "$dev" in
      195:*) minor="${dev#195:}"
             if [[ "$minor" =~ ^[0-9]+$ ]] && (( minor < 254 )); then out+=("$minor"); fi ;;
    esac
  done < "$list"
  [ "${#out[@]}" -gt 0 ] || return 1
  printf '%s\n' "${out[*]}"
}

proof_slurm_announce() {
  local phase="$1" who="proof-${1/start/prolog}"
  who="${who/stop/epilog}"
  local job="${SLURM_JOB_ID:-}"
  if ! [[ "$job" =~ ^[0-9]+(_[0-9]+)?$ ]]; then
    echo "$who: SLURM_JOB_ID '${job}' is not a Slurm job id; nothing announced" >&2
    return 0
  fi
  local inbox="${PROOF_AGENT_INBOX:-/var/lib/proof-agent/inbox}"
  if [ ! -d "$inbox" ]; then
    echo "$who: no agent inbox at $inbox (is proof-agent installed and started?); nothing announced" >&2
    return 0
  fi
  local ts
  ts="$(date +%s.%N 2>/dev/null || date +%s)"
  local rec
  if [ "$phase" = start ]; then
    local indices="" source=""
    if [ -n "${SLURM_JOB_GPUS:-}" ]; then
      if indices="$(_proof_expand_indices "$SLURM_JOB_GPUS")"; then
        source=SLURM_JOB_GPUS
      else
        echo "$who: SLURM_JOB_GPUS '${SLURM_JOB_GPUS}' is not a list of GPU indices; ignored" >&2
        indices=""
      fi
    fi
    if [ -z "$source" ] && indices="$(_proof_cgroup_gpus)"; then
      source=cgroup
    fi
    local list=""
    if [ -n "$indices" ]; then list="${indices// /,}"; fi
    rec="{\"type\":\"job\",\"ts\":$ts,\"job\":\"$job\",\"scheduler\":\"slurm\",\"state\":\"running\""
    local key var
    for key in slurm_user:SLURM_JOB_USER slurm_account:SLURM_JOB_ACCOUNT slurm_partition:SLURM_JOB_PARTITION; do
      var="${key#*:}"
      if [ -n "${!var:-}" ]; then rec+=",\"${key%%:*}\":$(_proof_json_str "${!var}")"; fi
    done
    rec+=",\"config\":{\"gpu_indices\":[${list}]"
    if [ -n "$source" ]; then rec+=",\"gpu_source\":\"$source\""; fi
    rec+="},\"allocation\":{\"gpu_indices\":[${list}]}}"
  else
    rec="{\"type\":\"job\",\"ts\":$ts,\"job\":\"$job\",\"scheduler\":\"slurm\",\"allocation\":{\"gpu_indices\":[]}}"
    rm -f "$inbox/slurm-$job.start.jsonl"
  fi
  # Written whole under a name the agent does not read, then renamed: it never sees half a line.
  local tmp="$inbox/.slurm-$job.$phase.$$"
  if printf '%s\n' "$rec" > "$tmp" 2>/dev/null && mv -f "$tmp" "$inbox/slurm-$job.$phase.jsonl"; then
    return 0
  fi
  rm -f "$tmp" 2>/dev/null
  echo "$who: cannot write to $inbox; nothing announced" >&2
  return 0
}
