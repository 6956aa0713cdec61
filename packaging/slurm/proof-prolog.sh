#!/usr/bin/env bash
# Slurm Prolog for the Proof agent: announce the job's allocation on this node to the local
# agent, so the job's GPUs are keyed to it before its first process or log line (a job that
# hangs in its data loader or rendezvous still has GPU samples with its job id).
#
# Install (slurm.conf, on every GPU node):
#   Prolog=/etc/slurm/prolog.d/*          # or Prolog=/usr/local/sbin/proof-prolog.sh
#   Epilog=/etc/slurm/epilog.d/*
#   PrologFlags=Alloc                     # run at allocation, not at the first step
# with this file as /etc/slurm/prolog.d/50-proof.sh and proof-epilog.sh as
# /etc/slurm/epilog.d/50-proof.sh (mode 0755, owned by root).
#
# What it writes: one trace-v1 `job` record into the agent's inbox (the directory
# `proof-agent exec` writes to; agent/collectors/inbox.py reads it), with the job's GPUs as the
# local `allocation` key (indices on this node) and in `config`. GPUs come from
# SLURM_JOB_GPUS (set for Prolog/Epilog with GRES gpu), else from the job's cgroup v1 devices
# list (c 195:N = /dev/nvidiaN); with cgroup v2 and no SLURM_JOB_GPUS nothing is known.
#
# A prolog that fails drains the node: this script never fails. Whatever goes wrong is said
# on stderr (slurmd's log) and it exits 0.
#
# Environment (all optional but SLURM_JOB_ID): SLURM_JOB_GPUS, SLURM_JOB_UID, SLURM_JOB_USER,
# SLURM_JOB_ACCOUNT, SLURM_JOB_PARTITION; PROOF_AGENT_INBOX (default
# /var/lib/proof-agent/inbox), PROOF_CGROUP_ROOT (default /sys/fs/cgroup).
set -u
# The shared part: next to this script (a checkout), else /usr/local/lib/proof-agent (installed;
# not in prolog.d, where a Prolog=…/* glob would run it as a prolog of its own).
_common=""
for _dir in "$(dirname "$(readlink -f "$0")")" /usr/local/lib/proof-agent; do
  if [ -r "$_dir/proof-slurm-common.sh" ]; then _common="$_dir/proof-slurm-common.sh"; break; fi
done
if [ -z "$_common" ] || ! . "$_common"; then
  echo "proof-prolog: proof-slurm-common.sh not found (next to $0 or in /usr/local/lib/proof-agent); nothing announced" >&2
  exit 0
fi
proof_slurm_announce start
exit 0
