from gradcode.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FetchModelRequest(_message.Message):
    __slots__ = ("job_id", "iteration")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    iteration: int
    def __init__(self, job_id: _Optional[str] = ..., iteration: _Optional[int] = ...) -> None: ...

class FetchModelReply(_message.Message):
    __slots__ = ("part",)
    PART_FIELD_NUMBER: _ClassVar[int]
    part: bytes
    def __init__(self, part: _Optional[bytes] = ...) -> None: ...

class HelloRequest(_message.Message):
    __slots__ = ("nonce",)
    NONCE_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    def __init__(self, nonce: _Optional[bytes] = ...) -> None: ...

class OpenLinkRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LinkOffer(_message.Message):
    __slots__ = ("port", "token", "tls")
    PORT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TLS_FIELD_NUMBER: _ClassVar[int]
    port: int
    token: bytes
    tls: bool
    def __init__(self, port: _Optional[int] = ..., token: _Optional[bytes] = ..., tls: _Optional[bool] = ...) -> None: ...

class HelloReply(_message.Message):
    __slots__ = ("instance_id", "proof")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    proof: bytes
    def __init__(self, instance_id: _Optional[str] = ..., proof: _Optional[bytes] = ...) -> None: ...

class RowDefinition(_message.Message):
    __slots__ = ("row", "partitions", "coefficients_real", "coefficients_imag")
    ROW_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    COEFFICIENTS_REAL_FIELD_NUMBER: _ClassVar[int]
    COEFFICIENTS_IMAG_FIELD_NUMBER: _ClassVar[int]
    row: int
    partitions: _containers.RepeatedScalarFieldContainer[int]
    coefficients_real: _containers.RepeatedScalarFieldContainer[float]
    coefficients_imag: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, row: _Optional[int] = ..., partitions: _Optional[_Iterable[int]] = ..., coefficients_real: _Optional[_Iterable[float]] = ..., coefficients_imag: _Optional[_Iterable[float]] = ...) -> None: ...

class ChildSpec(_message.Message):
    __slots__ = ("worker_id", "address", "call_token", "descendants")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CALL_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DESCENDANTS_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    address: str
    call_token: str
    descendants: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, worker_id: _Optional[int] = ..., address: _Optional[str] = ..., call_token: _Optional[str] = ..., descendants: _Optional[_Iterable[int]] = ...) -> None: ...

class ParentRole(_message.Message):
    __slots__ = ("child_code", "children", "wait_seconds", "no_links", "integrity")
    CHILD_CODE_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NO_LINKS_FIELD_NUMBER: _ClassVar[int]
    INTEGRITY_FIELD_NUMBER: _ClassVar[int]
    child_code: _common_pb2.CodeSpec
    children: _containers.RepeatedCompositeFieldContainer[ChildSpec]
    wait_seconds: float
    no_links: bool
    integrity: str
    def __init__(self, child_code: _Optional[_Union[_common_pb2.CodeSpec, _Mapping]] = ..., children: _Optional[_Iterable[_Union[ChildSpec, _Mapping]]] = ..., wait_seconds: _Optional[float] = ..., no_links: _Optional[bool] = ..., integrity: _Optional[str] = ...) -> None: ...

class JobSetup(_message.Message):
    __slots__ = ("job_id", "worker_id", "model", "rows", "num_partitions_sent", "straggler", "parent", "message_dtype", "append_statistics", "local_data", "shared_memory", "iterations")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    NUM_PARTITIONS_SENT_FIELD_NUMBER: _ClassVar[int]
    STRAGGLER_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    APPEND_STATISTICS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_DATA_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    worker_id: int
    model: _common_pb2.ModelSpec
    rows: _containers.RepeatedCompositeFieldContainer[RowDefinition]
    num_partitions_sent: int
    straggler: _common_pb2.StragglerSpec
    parent: ParentRole
    message_dtype: _common_pb2.DType
    append_statistics: bool
    local_data: LocalData
    shared_memory: SharedMemoryOffer
    iterations: int
    def __init__(self, job_id: _Optional[str] = ..., worker_id: _Optional[int] = ..., model: _Optional[_Union[_common_pb2.ModelSpec, _Mapping]] = ..., rows: _Optional[_Iterable[_Union[RowDefinition, _Mapping]]] = ..., num_partitions_sent: _Optional[int] = ..., straggler: _Optional[_Union[_common_pb2.StragglerSpec, _Mapping]] = ..., parent: _Optional[_Union[ParentRole, _Mapping]] = ..., message_dtype: _Optional[_Union[_common_pb2.DType, str]] = ..., append_statistics: _Optional[bool] = ..., local_data: _Optional[_Union[LocalData, _Mapping]] = ..., shared_memory: _Optional[_Union[SharedMemoryOffer, _Mapping]] = ..., iterations: _Optional[int] = ...) -> None: ...

class SharedMemoryOffer(_message.Message):
    __slots__ = ("directory",)
    DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    directory: str
    def __init__(self, directory: _Optional[str] = ...) -> None: ...

class LocalData(_message.Message):
    __slots__ = ("dataset", "path", "options", "num_samples", "num_features", "dataset_seed", "test_fraction", "partition_seed", "partition_weights", "num_rows", "signed_labels")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DATASET_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    NUM_FEATURES_FIELD_NUMBER: _ClassVar[int]
    DATASET_SEED_FIELD_NUMBER: _ClassVar[int]
    TEST_FRACTION_FIELD_NUMBER: _ClassVar[int]
    PARTITION_SEED_FIELD_NUMBER: _ClassVar[int]
    PARTITION_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    SIGNED_LABELS_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    path: str
    options: _containers.ScalarMap[str, str]
    num_samples: int
    num_features: int
    dataset_seed: int
    test_fraction: float
    partition_seed: int
    partition_weights: _containers.RepeatedScalarFieldContainer[float]
    num_rows: int
    signed_labels: bool
    def __init__(self, dataset: _Optional[str] = ..., path: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ..., num_samples: _Optional[int] = ..., num_features: _Optional[int] = ..., dataset_seed: _Optional[int] = ..., test_fraction: _Optional[float] = ..., partition_seed: _Optional[int] = ..., partition_weights: _Optional[_Iterable[float]] = ..., num_rows: _Optional[int] = ..., signed_labels: _Optional[bool] = ...) -> None: ...

class PartitionData(_message.Message):
    __slots__ = ("partition", "num_samples", "features_offset", "features", "labels_offset", "labels")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    FEATURES_OFFSET_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    LABELS_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    num_samples: int
    features_offset: int
    features: bytes
    labels_offset: int
    labels: bytes
    def __init__(self, partition: _Optional[int] = ..., num_samples: _Optional[int] = ..., features_offset: _Optional[int] = ..., features: _Optional[bytes] = ..., labels_offset: _Optional[int] = ..., labels: _Optional[bytes] = ...) -> None: ...

class LoadJobChunk(_message.Message):
    __slots__ = ("setup", "data")
    SETUP_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    setup: JobSetup
    data: PartitionData
    def __init__(self, setup: _Optional[_Union[JobSetup, _Mapping]] = ..., data: _Optional[_Union[PartitionData, _Mapping]] = ...) -> None: ...

class LoadJobReply(_message.Message):
    __slots__ = ("job_id", "worker_id", "partitions", "bytes_received", "shared_memory_proof")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_PROOF_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    worker_id: int
    partitions: _containers.RepeatedScalarFieldContainer[int]
    bytes_received: int
    shared_memory_proof: str
    def __init__(self, job_id: _Optional[str] = ..., worker_id: _Optional[int] = ..., partitions: _Optional[_Iterable[int]] = ..., bytes_received: _Optional[int] = ..., shared_memory_proof: _Optional[str] = ...) -> None: ...

class ComputeRequest(_message.Message):
    __slots__ = ("job_id", "iteration", "worker_id", "model", "rows", "shared_model", "request_id", "cancel", "backup", "promote", "deferred", "report_start", "hold", "relayed_model")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    SHARED_MODEL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    BACKUP_FIELD_NUMBER: _ClassVar[int]
    PROMOTE_FIELD_NUMBER: _ClassVar[int]
    DEFERRED_FIELD_NUMBER: _ClassVar[int]
    REPORT_START_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    RELAYED_MODEL_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    iteration: int
    worker_id: int
    model: _common_pb2.Tensor
    rows: _containers.RepeatedScalarFieldContainer[int]
    shared_model: SharedModel
    request_id: int
    cancel: bool
    backup: bool
    promote: bool
    deferred: bool
    report_start: bool
    hold: bool
    relayed_model: RelayedModel
    def __init__(self, job_id: _Optional[str] = ..., iteration: _Optional[int] = ..., worker_id: _Optional[int] = ..., model: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., rows: _Optional[_Iterable[int]] = ..., shared_model: _Optional[_Union[SharedModel, _Mapping]] = ..., request_id: _Optional[int] = ..., cancel: _Optional[bool] = ..., backup: _Optional[bool] = ..., promote: _Optional[bool] = ..., deferred: _Optional[bool] = ..., report_start: _Optional[bool] = ..., hold: _Optional[bool] = ..., relayed_model: _Optional[_Union[RelayedModel, _Mapping]] = ...) -> None: ...

class RelayedModel(_message.Message):
    __slots__ = ("address", "bearer", "length", "digest", "hops")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BEARER_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    HOPS_FIELD_NUMBER: _ClassVar[int]
    address: str
    bearer: str
    length: int
    digest: bytes
    hops: int
    def __init__(self, address: _Optional[str] = ..., bearer: _Optional[str] = ..., length: _Optional[int] = ..., digest: _Optional[bytes] = ..., hops: _Optional[int] = ...) -> None: ...

class SharedModel(_message.Message):
    __slots__ = ("length", "xxh3")
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    XXH3_FIELD_NUMBER: _ClassVar[int]
    length: int
    xxh3: int
    def __init__(self, length: _Optional[int] = ..., xxh3: _Optional[int] = ...) -> None: ...

class MessageHeader(_message.Message):
    __slots__ = ("dtype", "length")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    dtype: _common_pb2.DType
    length: int
    def __init__(self, dtype: _Optional[_Union[_common_pb2.DType, str]] = ..., length: _Optional[int] = ...) -> None: ...

class MessageTrailer(_message.Message):
    __slots__ = ("xxh3", "compute_seconds", "straggle_seconds", "model_seconds", "approximate", "decode_error", "children_lost", "magnitude", "children_singled_out", "children_quarantined", "children_timings", "children_late")
    XXH3_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STRAGGLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    APPROXIMATE_FIELD_NUMBER: _ClassVar[int]
    DECODE_ERROR_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_LOST_FIELD_NUMBER: _ClassVar[int]
    MAGNITUDE_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_SINGLED_OUT_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_TIMINGS_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_LATE_FIELD_NUMBER: _ClassVar[int]
    xxh3: int
    compute_seconds: float
    straggle_seconds: float
    model_seconds: float
    approximate: bool
    decode_error: float
    children_lost: _containers.RepeatedScalarFieldContainer[int]
    magnitude: float
    children_singled_out: _containers.RepeatedScalarFieldContainer[int]
    children_quarantined: _containers.RepeatedScalarFieldContainer[int]
    children_timings: _containers.RepeatedCompositeFieldContainer[ChildTiming]
    children_late: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, xxh3: _Optional[int] = ..., compute_seconds: _Optional[float] = ..., straggle_seconds: _Optional[float] = ..., model_seconds: _Optional[float] = ..., approximate: _Optional[bool] = ..., decode_error: _Optional[float] = ..., children_lost: _Optional[_Iterable[int]] = ..., magnitude: _Optional[float] = ..., children_singled_out: _Optional[_Iterable[int]] = ..., children_quarantined: _Optional[_Iterable[int]] = ..., children_timings: _Optional[_Iterable[_Union[ChildTiming, _Mapping]]] = ..., children_late: _Optional[_Iterable[int]] = ...) -> None: ...

class ChildTiming(_message.Message):
    __slots__ = ("worker_id", "seconds", "model_seconds", "compute_seconds", "straggle_seconds")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STRAGGLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    seconds: float
    model_seconds: float
    compute_seconds: float
    straggle_seconds: float
    def __init__(self, worker_id: _Optional[int] = ..., seconds: _Optional[float] = ..., model_seconds: _Optional[float] = ..., compute_seconds: _Optional[float] = ..., straggle_seconds: _Optional[float] = ...) -> None: ...

class GradientChunk(_message.Message):
    __slots__ = ("job_id", "iteration", "worker_id", "row", "offset", "header", "data", "trailer", "shared_payload", "request_id", "status", "started", "ready")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TRAILER_FIELD_NUMBER: _ClassVar[int]
    SHARED_PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    iteration: int
    worker_id: int
    row: int
    offset: int
    header: MessageHeader
    data: bytes
    trailer: MessageTrailer
    shared_payload: bool
    request_id: int
    status: CallStatus
    started: bool
    ready: bool
    def __init__(self, job_id: _Optional[str] = ..., iteration: _Optional[int] = ..., worker_id: _Optional[int] = ..., row: _Optional[int] = ..., offset: _Optional[int] = ..., header: _Optional[_Union[MessageHeader, _Mapping]] = ..., data: _Optional[bytes] = ..., trailer: _Optional[_Union[MessageTrailer, _Mapping]] = ..., shared_payload: _Optional[bool] = ..., request_id: _Optional[int] = ..., status: _Optional[_Union[CallStatus, _Mapping]] = ..., started: _Optional[bool] = ..., ready: _Optional[bool] = ...) -> None: ...

class CallStatus(_message.Message):
    __slots__ = ("code", "details", "children_lost")
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_LOST_FIELD_NUMBER: _ClassVar[int]
    code: int
    details: str
    children_lost: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, code: _Optional[int] = ..., details: _Optional[str] = ..., children_lost: _Optional[_Iterable[int]] = ...) -> None: ...

class EndJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class EndJobReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
