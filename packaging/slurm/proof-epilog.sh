#!/usr/bin/env bash
# Slurm Epilog for the Proof agent: the job's allocation on this node has ended, so its GPUs
# are no longer keyed to it (the next job's samples are not the last one's). Install next to
# proof-prolog.sh (see there). Never fails: problems go to stderr and it exits 0.
set -u
# The shared part: next to this script (a checkout), else /usr/local/lib/proof-agent (installed;
# not in prolog.d, where a Prolog=…/* glob would run it as a prolog of its own).
_common=""
for _dir in "$(dirname "$(readlink -f "$0")")" /usr/local/lib/proof-agent; do
  if [ -r "$_dir/proof-slurm-common.sh" ]; then _common="$_dir/proof-slurm-common.sh"; break; fi
done
if [ -z "$_common" ] || ! . "$_common"; then
  echo "proof-epilog: proof-slurm-common.sh not found (next to $0 or in /usr/local/lib/proof-agent); nothing announced" >&2
  exit 0
fi
proof_slurm_announce stop
exit 0
