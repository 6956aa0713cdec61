"""Pure text parsers used by the agent's collectors (no I/O, no Django).

`prometheus` parses the Prometheus text exposition format, `training` reads training-framework
stdout lines, `kernel` reads NVIDIA XID lines out of kernel-log text.
"""
