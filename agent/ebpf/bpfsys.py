"""The few kernel interfaces the eBPF collector needs at run time, without bcc.

bcc compiles with an embedded LLVM/clang: importing it costs the agent ~64 MiB of RSS and a
compile ~135 MiB. So the agent compiles and loads the BPF program in a short-lived child
process (agent.ebpf.loader), receives the program and map file descriptors over a Unix socket,
and from then on needs only what is here: the bpf(2) map commands, perf_event_open(2) with the
uprobe PMU to attach a loaded program to a file offset, and the ELF symbol table to turn a
symbol name into that offset.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import platform
import struct
from collections.abc import Iterator

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

_SYSCALLS = {  # (bpf, perf_event_open)
    "x86_64": (321, 298),
    "aarch64": (280, 241),
}

BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_MAP_GET_NEXT_KEY = 4
BPF_MAP_LOOKUP_BATCH = 24  # Linux 5.6+
BPF_MAP_DELETE_BATCH = 27
_ENOTSUPP = 524  # the kernel's internal "not supported", as bpf(2) may return it

PERF_FLAG_FD_CLOEXEC = 8
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_SET_BPF = 0x40042408  # _IOW('$', 8, __u32)
UPROBE_PMU = "/sys/bus/event_source/devices/uprobe"


class BpfError(OSError):
    """A bpf(2) or perf_event_open(2) call failed."""


def _numbers() -> tuple[int, int]:
    machine = platform.machine()
    if machine not in _SYSCALLS:
        raise BpfError(errno.ENOSYS, f"no bpf syscall numbers for {machine}")
    return _SYSCALLS[machine]


class _MapElemAttr(ctypes.Structure):
    _fields_ = [
        ("map_fd", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("key", ctypes.c_uint64),
        ("value", ctypes.c_uint64),  # or next_key
        ("flags", ctypes.c_uint64),
    ]


def _bpf(cmd: int, attr: _MapElemAttr) -> int:
    result = _libc.syscall(_numbers()[0], cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if result < 0:
        code = ctypes.get_errno()
        raise BpfError(code, os.strerror(code))
    return int(result)


def _address(buffer: ctypes.Array[ctypes.c_char]) -> int:
    return ctypes.addressof(buffer)


def lookup(map_fd: int, key: bytes, value_size: int) -> bytes | None:
    """The value under `key`, or None if absent. `value_size` is the whole value: for a
    per-CPU map, the per-CPU size rounded up to 8 times the number of possible CPUs."""
    key_buffer = ctypes.create_string_buffer(key, len(key))
    value_buffer = ctypes.create_string_buffer(value_size)
    attr = _MapElemAttr(map_fd, 0, _address(key_buffer), _address(value_buffer), 0)
    try:
        _bpf(BPF_MAP_LOOKUP_ELEM, attr)
    except BpfError as error:
        if error.errno == errno.ENOENT:
            return None
        raise
    return value_buffer.raw


def update(map_fd: int, key: bytes, value: bytes) -> None:
    key_buffer = ctypes.create_string_buffer(key, len(key))
    value_buffer = ctypes.create_string_buffer(value, len(value))
    _bpf(
        BPF_MAP_UPDATE_ELEM,
        _MapElemAttr(map_fd, 0, _address(key_buffer), _address(value_buffer), 0),
    )


def delete(map_fd: int, key: bytes) -> bool:
    """False if the key was not there."""
    key_buffer = ctypes.create_string_buffer(key, len(key))
    try:
        _bpf(BPF_MAP_DELETE_ELEM, _MapElemAttr(map_fd, 0, _address(key_buffer), 0, 0))
    except BpfError as error:
        if error.errno == errno.ENOENT:
            return False
        raise
    return True


def keys(map_fd: int, key_size: int) -> Iterator[bytes]:
    """Every key of a hash map (a snapshot as the kernel walks it; do not delete while
    iterating — collect the keys first)."""
    current: ctypes.Array[ctypes.c_char] | None = None
    while True:
        following = ctypes.create_string_buffer(key_size)
        attr = _MapElemAttr(
            map_fd, 0, _address(current) if current is not None else 0, _address(following), 0
        )
        try:
            _bpf(BPF_MAP_GET_NEXT_KEY, attr)
        except BpfError as error:
            if error.errno == errno.ENOENT:
                return
            raise
        yield following.raw
        current = following


class _BatchAttr(ctypes.Structure):
    _fields_ = [
        ("in_batch", ctypes.c_uint64),
        ("out_batch", ctypes.c_uint64),
        ("keys", ctypes.c_uint64),
        ("values", ctypes.c_uint64),
        ("count", ctypes.c_uint32),
        ("map_fd", ctypes.c_uint32),
        ("elem_flags", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
    ]


# Whether this kernel has the batch commands (None until first tried).
_batch_supported: bool | None = None
_UNSUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, _ENOTSUPP)


def _bpf_batch(cmd: int, attr: _BatchAttr) -> int:
    result = _libc.syscall(_numbers()[0], cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    return 0 if result >= 0 else ctypes.get_errno()


def items(
    map_fd: int, key_size: int, value_size: int, chunk: int = 256
) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of a hash map: with BPF_MAP_LOOKUP_BATCH, a few syscalls for the
    whole map; on a kernel without it, one GET_NEXT_KEY and one LOOKUP per key."""
    global _batch_supported
    if _batch_supported is not False:
        try:
            got = _lookup_batch(map_fd, key_size, value_size, chunk)
        except BpfError as error:
            if _batch_supported or error.errno not in _UNSUPPORTED:
                raise
            got = None
        if got is not None:
            _batch_supported = True
            return got
        _batch_supported = False
    out = []
    for key in list(keys(map_fd, key_size)):
        value = lookup(map_fd, key, value_size)
        if value is not None:
            out.append((key, value))
    return out


def _lookup_batch(
    map_fd: int, key_size: int, value_size: int, chunk: int
) -> list[tuple[bytes, bytes]] | None:
    out: list[tuple[bytes, bytes]] = []
    # The batch token is the kernel's position in the map (a bucket index for a hash map).
    token_size = max(8, key_size)
    in_token = ctypes.create_string_buffer(token_size)
    out_token = ctypes.create_string_buffer(token_size)
    first = True
    while True:
        keys_buffer = ctypes.create_string_buffer(key_size * chunk)
        values_buffer = ctypes.create_string_buffer(value_size * chunk)
        attr = _BatchAttr(
            0 if first else _address(in_token),
            _address(out_token),
            _address(keys_buffer),
            _address(values_buffer),
            chunk,
            map_fd,
            0,
            0,
        )
        code = _bpf_batch(BPF_MAP_LOOKUP_BATCH, attr)
        if code == errno.ENOSPC and attr.count == 0:
            chunk *= 2  # one hash bucket holds more entries than fit: retry larger
            continue
        if code not in (0, errno.ENOENT):
            if code in _UNSUPPORTED and first and not out:
                return None
            raise BpfError(code, os.strerror(code))
        keys_raw, values_raw = keys_buffer.raw, values_buffer.raw
        for i in range(attr.count):
            out.append(
                (
                    keys_raw[i * key_size : (i + 1) * key_size],
                    values_raw[i * value_size : (i + 1) * value_size],
                )
            )
        if code == errno.ENOENT:  # the walk is complete
            return out
        ctypes.memmove(in_token, out_token, token_size)
        first = False


def delete_many(map_fd: int, keys_: list[bytes], key_size: int) -> None:
    """Delete these keys (one BPF_MAP_DELETE_BATCH where the kernel has it); a key already
    gone is not an error."""
    if not keys_:
        return
    if _batch_supported:
        buffer = ctypes.create_string_buffer(b"".join(keys_), key_size * len(keys_))
        attr = _BatchAttr(0, 0, _address(buffer), 0, len(keys_), map_fd, 0, 0)
        code = _bpf_batch(BPF_MAP_DELETE_BATCH, attr)
        if code == 0:
            return
        keys_ = keys_[attr.count :]  # it stops at the first key that fails (e.g. gone)
    for key in keys_:
        delete(map_fd, key)


def possible_cpus() -> int:
    """How many values a per-CPU map holds per key (/sys/devices/system/cpu/possible)."""
    with open("/sys/devices/system/cpu/possible", encoding="ascii") as possible:
        text = possible.read().strip()
    count = 0
    for part in text.split(","):
        low, _, high = part.partition("-")
        count = max(count, int(high or low) + 1)
    return count


# --- uprobes through the perf uprobe PMU ----------------------------------------------------


class _PerfEventAttr(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),  # uprobe_path
        ("config2", ctypes.c_uint64),  # probe_offset
        ("padding", ctypes.c_uint8 * 64),  # later fields, zero
    ]


def _uprobe_pmu() -> tuple[int, int]:
    """(PMU type, the config bit that makes it a return probe)."""
    with open(os.path.join(UPROBE_PMU, "type"), encoding="ascii") as type_file:
        pmu_type = int(type_file.read())
    with open(os.path.join(UPROBE_PMU, "format", "retprobe"), encoding="ascii") as fmt:
        bit = int(fmt.read().strip().split(":")[1])  # "config:0"
    return pmu_type, bit


def attach_uprobe(prog_fd: int, path: str, offset: int, *, retprobe: bool = False) -> int:
    """Attach the loaded program to `path` at file `offset` (entry, or return with
    `retprobe`) in every process; returns the perf event fd — close it to detach."""
    pmu_type, retprobe_bit = _uprobe_pmu()
    path_buffer = ctypes.create_string_buffer(os.fsencode(path))
    attr = _PerfEventAttr()
    attr.type = pmu_type
    attr.size = ctypes.sizeof(_PerfEventAttr)
    attr.config = (1 << retprobe_bit) if retprobe else 0
    attr.sample_period = 1
    attr.wakeup_events = 1
    attr.config1 = ctypes.addressof(path_buffer)
    attr.config2 = offset
    # path_buffer stays referenced here until the syscall below has copied the path.
    return _open_with_program(attr, prog_fd, f"uprobe {path}+{offset:#x}")


def _open_with_program(attr: _PerfEventAttr, prog_fd: int, what: str) -> int:
    """perf_event_open `attr`, attach the BPF program to it and enable it; the event fd."""
    # pid -1, cpu 0: every process; an attached BPF program runs on every CPU regardless.
    fd = _libc.syscall(_numbers()[1], ctypes.byref(attr), -1, 0, -1, PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        code = ctypes.get_errno()
        raise BpfError(code, f"perf_event_open {what}: {os.strerror(code)}")
    try:
        fcntl.ioctl(fd, PERF_EVENT_IOC_SET_BPF, prog_fd)
        fcntl.ioctl(fd, PERF_EVENT_IOC_ENABLE, 0)
    except OSError:
        os.close(fd)
        raise
    return int(fd)


# --- ELF symbols ----------------------------------------------------------------------------

_SHT_SYMTAB = 2
_SHT_DYNSYM = 11
_STT_FUNC = 2
_STT_GNU_IFUNC = 10
_PT_LOAD = 1


def function_offsets(path: str, names: set[str]) -> dict[str, int]:
    """name → file offset of each of `names` defined as a function in the ELF file at `path`
    (from .dynsym and, when present, .symtab): where a uprobe on that function goes."""
    with open(path, "rb") as elf:
        data = elf.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
    (phoff, shoff) = struct.unpack_from("<QQ", data, 0x20)
    (phentsize, phnum, shentsize, shnum) = struct.unpack_from("<HHHH", data, 0x36)
    loads = []
    for i in range(phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, _filesz, p_memsz, _align = struct.unpack_from(
            "<IIQQQQQQ", data, phoff + i * phentsize
        )
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_memsz, p_offset))
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    found: dict[str, int] = {}
    for _name, sh_type, _f, _a, sh_offset, sh_size, sh_link, _i, _al, sh_entsize in sections:
        if sh_type not in (_SHT_DYNSYM, _SHT_SYMTAB) or not sh_entsize:
            continue
        strtab_offset = sections[sh_link][4]
        for index in range(sh_size // sh_entsize):
            st_name, st_info, _other, st_shndx, st_value, _size = struct.unpack_from(
                "<IBBHQQ", data, sh_offset + index * sh_entsize
            )
            if st_info & 0xF not in (_STT_FUNC, _STT_GNU_IFUNC) or st_shndx == 0 or not st_value:
                continue
            end = data.index(b"\0", strtab_offset + st_name)
            name = data[strtab_offset + st_name : end].decode("ascii", "replace")
            if name not in names or name in found:
                continue
            for vaddr, memsz, offset in loads:
                if vaddr <= st_value < vaddr + memsz:
                    found[name] = st_value - vaddr + offset
                    break
    return found


# --- tracepoints and BPF ring buffers -------------------------------------------------------

PERF_TYPE_TRACEPOINT = 2
TRACEFS_EVENTS = ("/sys/kernel/tracing/events", "/sys/kernel/debug/tracing/events")


def attach_tracepoint(prog_fd: int, category: str, name: str) -> int:
    """Attach a loaded tracepoint program to `category:name`; returns the perf event fd."""
    for root in TRACEFS_EVENTS:
        id_path = os.path.join(root, category, name, "id")
        if os.path.exists(id_path):
            with open(id_path, encoding="ascii") as id_file:
                tracepoint_id = int(id_file.read())
            break
    else:
        raise BpfError(errno.ENOENT, f"no tracepoint {category}:{name} (is tracefs mounted?)")
    attr = _PerfEventAttr()
    attr.type = PERF_TYPE_TRACEPOINT
    attr.size = ctypes.sizeof(_PerfEventAttr)
    attr.config = tracepoint_id
    attr.sample_period = 1
    attr.wakeup_events = 1
    return _open_with_program(attr, prog_fd, f"{category}:{name}")


class RingBuffer:
    """The consumer side of a BPF_MAP_TYPE_RINGBUF map, through mmap (as libbpf does it):
    page 0 holds the consumer position (ours to write), then the producer position page and
    the data area, mapped twice back to back so a record that wraps reads straight through."""

    _BUSY = 1 << 31
    _DISCARD = 1 << 30
    _HEADER = 8

    def __init__(self, map_fd: int, data_size: int) -> None:
        self.page = mmap.PAGESIZE
        self.mask = data_size - 1
        self.consumer = mmap.mmap(
            map_fd, self.page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
        )
        self.producer = mmap.mmap(
            map_fd, self.page + 2 * data_size, mmap.MAP_SHARED, mmap.PROT_READ, offset=self.page
        )

    def consume(self) -> Iterator[bytes]:
        """Every record committed since the last call, oldest first."""
        (consumer_pos,) = struct.unpack_from("<Q", self.consumer, 0)
        (producer_pos,) = struct.unpack_from("<Q", self.producer, 0)
        while consumer_pos < producer_pos:
            at = self.page + (consumer_pos & self.mask)
            (length,) = struct.unpack_from("<I", self.producer, at)
            if length & self._BUSY:
                break  # reserved, not yet submitted: next time
            size = length & ~(self._BUSY | self._DISCARD)
            record = None
            if not length & self._DISCARD:
                record = bytes(self.producer[at + self._HEADER : at + self._HEADER + size])
            consumer_pos += (size + self._HEADER + 7) & ~7
            # Copied out: give the space back to the producer before handing the record on.
            struct.pack_into("<Q", self.consumer, 0, consumer_pos)
            if record is not None:
                yield record

    def close(self) -> None:
        self.consumer.close()
        self.producer.close()
