from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GpuInfo(_message.Message):
    __slots__ = ("uuid", "index", "model", "memory_mib", "driver_version", "cuda_version")
    UUID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CUDA_VERSION_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    index: int
    model: str
    memory_mib: int
    driver_version: str
    cuda_version: str
    def __init__(self, uuid: _Optional[str] = ..., index: _Optional[int] = ..., model: _Optional[str] = ..., memory_mib: _Optional[int] = ..., driver_version: _Optional[str] = ..., cuda_version: _Optional[str] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("agent_id", "hostname", "agent_version", "gpus")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    hostname: str
    agent_version: str
    gpus: _containers.RepeatedCompositeFieldContainer[GpuInfo]
    def __init__(self, agent_id: _Optional[str] = ..., hostname: _Optional[str] = ..., agent_version: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GpuInfo, _Mapping]]] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("session_id", "last_sequence", "server_time_ms", "max_batch_bytes")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_BYTES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    last_sequence: int
    server_time_ms: int
    max_batch_bytes: int
    def __init__(self, session_id: _Optional[str] = ..., last_sequence: _Optional[int] = ..., server_time_ms: _Optional[int] = ..., max_batch_bytes: _Optional[int] = ...) -> None: ...

class Identity(_message.Message):
    __slots__ = ("node", "gpu", "gpu_index", "pid", "job", "rank", "local_rank", "step")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    node: int
    gpu: int
    gpu_index: int
    pid: int
    job: int
    rank: int
    local_rank: int
    step: int
    def __init__(self, node: _Optional[int] = ..., gpu: _Optional[int] = ..., gpu_index: _Optional[int] = ..., pid: _Optional[int] = ..., job: _Optional[int] = ..., rank: _Optional[int] = ..., local_rank: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...

class SeriesDef(_message.Message):
    __slots__ = ("name", "identity", "labels")
    NAME_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    name: int
    identity: Identity
    labels: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[int] = ..., identity: _Optional[_Union[Identity, _Mapping]] = ..., labels: _Optional[_Iterable[int]] = ...) -> None: ...

class LogLine(_message.Message):
    __slots__ = ("ts_us", "identity", "stream", "line")
    TS_US_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    ts_us: int
    identity: Identity
    stream: int
    line: str
    def __init__(self, ts_us: _Optional[int] = ..., identity: _Optional[_Union[Identity, _Mapping]] = ..., stream: _Optional[int] = ..., line: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("ts_us", "name", "identity", "value", "text", "labels")
    TS_US_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ts_us: int
    name: int
    identity: Identity
    value: float
    text: str
    labels: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ts_us: _Optional[int] = ..., name: _Optional[int] = ..., identity: _Optional[_Union[Identity, _Mapping]] = ..., value: _Optional[float] = ..., text: _Optional[str] = ..., labels: _Optional[_Iterable[int]] = ...) -> None: ...

class ProcessRecord(_message.Message):
    __slots__ = ("ts_us", "identity", "world_size", "cmd")
    TS_US_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    CMD_FIELD_NUMBER: _ClassVar[int]
    ts_us: int
    identity: Identity
    world_size: int
    cmd: str
    def __init__(self, ts_us: _Optional[int] = ..., identity: _Optional[_Union[Identity, _Mapping]] = ..., world_size: _Optional[int] = ..., cmd: _Optional[str] = ...) -> None: ...

class ExitRecord(_message.Message):
    __slots__ = ("ts_us", "identity", "exit_code")
    TS_US_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    ts_us: int
    identity: Identity
    exit_code: int
    def __init__(self, ts_us: _Optional[int] = ..., identity: _Optional[_Union[Identity, _Mapping]] = ..., exit_code: _Optional[int] = ...) -> None: ...

class JobRecord(_message.Message):
    __slots__ = ("ts_us", "job", "kind", "name", "nodes", "world_size", "scheduler", "state", "exit_code", "config_json", "rerun_of", "attributes")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TS_US_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    RERUN_OF_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    ts_us: int
    job: int
    kind: str
    name: str
    nodes: _containers.RepeatedScalarFieldContainer[int]
    world_size: int
    scheduler: str
    state: str
    exit_code: int
    config_json: str
    rerun_of: str
    attributes: _containers.ScalarMap[str, str]
    def __init__(self, ts_us: _Optional[int] = ..., job: _Optional[int] = ..., kind: _Optional[str] = ..., name: _Optional[str] = ..., nodes: _Optional[_Iterable[int]] = ..., world_size: _Optional[int] = ..., scheduler: _Optional[str] = ..., state: _Optional[str] = ..., exit_code: _Optional[int] = ..., config_json: _Optional[str] = ..., rerun_of: _Optional[str] = ..., attributes: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("agent_id", "sequence", "strings", "series", "sample_counts", "ts_ms", "values", "logs", "events", "processes", "exits", "jobs")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    STRINGS_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_COUNTS_FIELD_NUMBER: _ClassVar[int]
    TS_MS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    LOGS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    EXITS_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    sequence: int
    strings: _containers.RepeatedScalarFieldContainer[str]
    series: _containers.RepeatedCompositeFieldContainer[SeriesDef]
    sample_counts: _containers.RepeatedScalarFieldContainer[int]
    ts_ms: _containers.RepeatedScalarFieldContainer[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    logs: _containers.RepeatedCompositeFieldContainer[LogLine]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    processes: _containers.RepeatedCompositeFieldContainer[ProcessRecord]
    exits: _containers.RepeatedCompositeFieldContainer[ExitRecord]
    jobs: _containers.RepeatedCompositeFieldContainer[JobRecord]
    def __init__(self, agent_id: _Optional[str] = ..., sequence: _Optional[int] = ..., strings: _Optional[_Iterable[str]] = ..., series: _Optional[_Iterable[_Union[SeriesDef, _Mapping]]] = ..., sample_counts: _Optional[_Iterable[int]] = ..., ts_ms: _Optional[_Iterable[int]] = ..., values: _Optional[_Iterable[float]] = ..., logs: _Optional[_Iterable[_Union[LogLine, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., processes: _Optional[_Iterable[_Union[ProcessRecord, _Mapping]]] = ..., exits: _Optional[_Iterable[_Union[ExitRecord, _Mapping]]] = ..., jobs: _Optional[_Iterable[_Union[JobRecord, _Mapping]]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("sequence", "status", "samples")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATUS_UNSPECIFIED: _ClassVar[Ack.Status]
        STORED: _ClassVar[Ack.Status]
        DUPLICATE: _ClassVar[Ack.Status]
    STATUS_UNSPECIFIED: Ack.Status
    STORED: Ack.Status
    DUPLICATE: Ack.Status
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    status: Ack.Status
    samples: int
    def __init__(self, sequence: _Optional[int] = ..., status: _Optional[_Union[Ack.Status, str]] = ..., samples: _Optional[int] = ...) -> None: ...
