#!/usr/bin/env bash
# eBPF (bcc) prerequisites for agent/ebpf and its tests. Idempotent; runs as root from
# scripts/setup-system.sh after the Debian packages (python3-bpfcc, linux-headers-amd64, gcc)
# are installed.
#
# bcc compiles its BPF C at load time against the running kernel's headers, which it looks
# for in /lib/modules/$(uname -r)/{build,source}. On CI machines the running kernel is not a
# Debian kernel (a Firecracker guest kernel), so there is no /lib/modules for it: point those
# links at the newest Debian header tree. The uprobe programs only use UAPI-stable pieces
# (struct pt_regs, BPF helpers), so a header tree of another version compiles correctly.
#
# It never fails the setup: if the kernel refuses BPF, the bpf-marked tests skip with the
# reason, which is reported here too.
set -uo pipefail

warn() { echo "setup-system.d/bcc.sh: $*" >&2; }

release="$(uname -r)"
modules_dir="/lib/modules/$release"

# Newest Debian header tree: /usr/src/linux-headers-<ver>-<arch> beside -common.
arch_dir=""
for candidate in $(ls -d /usr/src/linux-headers-*-amd64 /usr/src/linux-headers-*-arm64 2>/dev/null | sort -V); do
  arch_dir="$candidate"
done
if [ -z "$arch_dir" ]; then
  warn "no /usr/src/linux-headers-* tree installed (linux-headers-amd64); bcc cannot compile"
else
  common_dir="${arch_dir%-*}-common"
  [ -d "$common_dir" ] || common_dir="$arch_dir"
  mkdir -p "$modules_dir"
  # Never replace a real header tree (a distribution kernel that ships its own).
  for pair in "build:$arch_dir" "source:$common_dir"; do
    link="$modules_dir/${pair%%:*}"
    target="${pair#*:}"
    if [ -L "$link" ] || [ ! -e "$link" ]; then
      ln -sfn "$target" "$link"
    fi
  done
fi

# tracefs (uprobe_events lives there; bcc attaches and detaches through it) and debugfs (older
# bcc looks for /sys/kernel/debug/tracing).
mountpoint -q /sys/kernel/tracing 2>/dev/null \
  || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null \
  || warn "could not mount tracefs at /sys/kernel/tracing"
mountpoint -q /sys/kernel/debug 2>/dev/null \
  || mount -t debugfs nodev /sys/kernel/debug 2>/dev/null \
  || warn "could not mount debugfs at /sys/kernel/debug"

# A one-line check that BPF programs load here, so CI logs say why the bpf tests skip.
if [ -x /usr/bin/python3 ]; then
  /usr/bin/python3 - <<'EOF' || warn "BPF programs cannot be loaded on this machine (bpf tests will skip)"
import bcc
bcc.BPF(text="int probe(void *ctx) { return 0; }").load_func("probe", bcc.BPF.KPROBE)
EOF
fi

# bcc's Python package is a system package (python3-bpfcc, /usr/lib/python3/dist-packages/bcc).
# agent/ebpf adds a directory holding only a link to it (never all of dist-packages) to
# sys.path when `import bcc` fails, so the project's virtualenv needs no change; this link is
# the one it looks for by default.
bcc_pkg=/usr/lib/python3/dist-packages/bcc
if [ -d "$bcc_pkg" ]; then
  mkdir -p /usr/local/lib/proof-bcc
  ln -sfn "$bcc_pkg" /usr/local/lib/proof-bcc/bcc
else
  warn "python3-bpfcc is not installed ($bcc_pkg missing)"
fi
exit 0
