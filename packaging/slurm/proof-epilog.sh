#!/usr/bin/env bash
# Slurm Epilog for the Proof agent: the job's allocation on this node has ended, so its GPUs
# are no longer keyed to it (the next job's samples are not the last one's). Install next to
# proof-prolog.sh (see there). Never fails: problems go to stderr and it exits 0.
set -u
. "$(dirname "$(readlink -f "$0")")/proof-slurm-common.sh" 2>/dev/null || {
  echo "proof-epilog: proof-slurm-common.sh not found next to $0; nothing announced" >&2
  exit 0
}
proof_slurm_announce stop
exit 0
