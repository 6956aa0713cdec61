"""eBPF uprobes on libcuda and libnccl (bcc), aggregated in the kernel per process.

See docs/ebpf.md. `EbpfCollector` (agent.ebpf.collector) is the collector; `ebpf_status()` and
`build_collectors()` (agent.ebpf.node) are what `proof-agent doctor` and the real-node backend
ask. This package module imports none of its submodules, so none of them forms a circle with it.
"""
