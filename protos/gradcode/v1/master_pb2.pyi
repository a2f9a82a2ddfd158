from google.protobuf import struct_pb2 as _struct_pb2
from gradcode.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_STATE_UNSPECIFIED: _ClassVar[WorkerState]
    WORKER_STATE_UP: _ClassVar[WorkerState]
    WORKER_STATE_DOWN: _ClassVar[WorkerState]

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_PENDING: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]
WORKER_STATE_UNSPECIFIED: WorkerState
WORKER_STATE_UP: WorkerState
WORKER_STATE_DOWN: WorkerState
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_PENDING: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("address", "name", "instance_id", "machine_id", "process_secret")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    PROCESS_SECRET_FIELD_NUMBER: _ClassVar[int]
    address: str
    name: str
    instance_id: str
    machine_id: str
    process_secret: bytes
    def __init__(self, address: _Optional[str] = ..., name: _Optional[str] = ..., instance_id: _Optional[str] = ..., machine_id: _Optional[str] = ..., process_secret: _Optional[bytes] = ...) -> None: ...

class RemoveWorkerRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    def __init__(self, worker_id: _Optional[int] = ...) -> None: ...

class RegisterWorkerReply(_message.Message):
    __slots__ = ("worker_id", "call_token")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_TOKEN_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    call_token: str
    def __init__(self, worker_id: _Optional[int] = ..., call_token: _Optional[str] = ...) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "address", "name", "state", "last_error", "last_seen_unix", "machine_id", "transport")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_FIELD_NUMBER: _ClassVar[int]
    MACHINE_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    address: str
    name: str
    state: WorkerState
    last_error: str
    last_seen_unix: float
    machine_id: str
    transport: str
    def __init__(self, worker_id: _Optional[int] = ..., address: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[_Union[WorkerState, str]] = ..., last_error: _Optional[str] = ..., last_seen_unix: _Optional[float] = ..., machine_id: _Optional[str] = ..., transport: _Optional[str] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWorkersReply(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ...) -> None: ...

class DatasetSpec(_message.Message):
    __slots__ = ("name", "path", "num_samples", "num_features", "seed", "test_fraction", "worker_local", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    NUM_FEATURES_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TEST_FRACTION_FIELD_NUMBER: _ClassVar[int]
    WORKER_LOCAL_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    num_samples: int
    num_features: int
    seed: int
    test_fraction: float
    worker_local: bool
    options: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., num_samples: _Optional[int] = ..., num_features: _Optional[int] = ..., seed: _Optional[int] = ..., test_fraction: _Optional[float] = ..., worker_local: _Optional[bool] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class OptimizerSpec(_message.Message):
    __slots__ = ("kind", "learning_rate", "momentum")
    KIND_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    kind: str
    learning_rate: float
    momentum: float
    def __init__(self, kind: _Optional[str] = ..., learning_rate: _Optional[float] = ..., momentum: _Optional[float] = ...) -> None: ...

class TreeSpec(_message.Message):
    __slots__ = ("parent_of",)
    PARENT_OF_FIELD_NUMBER: _ClassVar[int]
    parent_of: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, parent_of: _Optional[_Iterable[int]] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("job_id", "code", "model", "dataset", "optimizer", "iterations", "target_accuracy", "iteration_deadline_seconds", "verify", "straggler", "tree", "worker_ids", "seed", "wait_for_workers_seconds", "message_dtype", "extra", "evaluate_every", "integrity", "backup_priority", "surplus", "model_delivery", "initial_parameters")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    TARGET_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    ITERATION_DEADLINE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    VERIFY_FIELD_NUMBER: _ClassVar[int]
    STRAGGLER_FIELD_NUMBER: _ClassVar[int]
    TREE_FIELD_NUMBER: _ClassVar[int]
    WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    WAIT_FOR_WORKERS_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    EVALUATE_EVERY_FIELD_NUMBER: _ClassVar[int]
    INTEGRITY_FIELD_NUMBER: _ClassVar[int]
    BACKUP_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SURPLUS_FIELD_NUMBER: _ClassVar[int]
    MODEL_DELIVERY_FIELD_NUMBER: _ClassVar[int]
    INITIAL_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    code: _common_pb2.CodeSpec
    model: _common_pb2.ModelSpec
    dataset: DatasetSpec
    optimizer: OptimizerSpec
    iterations: int
    target_accuracy: float
    iteration_deadline_seconds: float
    verify: bool
    straggler: _common_pb2.StragglerSpec
    tree: TreeSpec
    worker_ids: _containers.RepeatedScalarFieldContainer[int]
    seed: int
    wait_for_workers_seconds: float
    message_dtype: _common_pb2.DType
    extra: _struct_pb2.Struct
    evaluate_every: int
    integrity: str
    backup_priority: str
    surplus: str
    model_delivery: str
    initial_parameters: _common_pb2.Tensor
    def __init__(self, job_id: _Optional[str] = ..., code: _Optional[_Union[_common_pb2.CodeSpec, _Mapping]] = ..., model: _Optional[_Union[_common_pb2.ModelSpec, _Mapping]] = ..., dataset: _Optional[_Union[DatasetSpec, _Mapping]] = ..., optimizer: _Optional[_Union[OptimizerSpec, _Mapping]] = ..., iterations: _Optional[int] = ..., target_accuracy: _Optional[float] = ..., iteration_deadline_seconds: _Optional[float] = ..., verify: _Optional[bool] = ..., straggler: _Optional[_Union[_common_pb2.StragglerSpec, _Mapping]] = ..., tree: _Optional[_Union[TreeSpec, _Mapping]] = ..., worker_ids: _Optional[_Iterable[int]] = ..., seed: _Optional[int] = ..., wait_for_workers_seconds: _Optional[float] = ..., message_dtype: _Optional[_Union[_common_pb2.DType, str]] = ..., extra: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., evaluate_every: _Optional[int] = ..., integrity: _Optional[str] = ..., backup_priority: _Optional[str] = ..., surplus: _Optional[str] = ..., model_delivery: _Optional[str] = ..., initial_parameters: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ...) -> None: ...

class JobInfo(_message.Message):
    __slots__ = ("job_id", "state", "message", "iterations_done", "spec")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_DONE_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    state: JobState
    message: str
    iterations_done: int
    spec: JobSpec
    def __init__(self, job_id: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., message: _Optional[str] = ..., iterations_done: _Optional[int] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class WorkerTiming(_message.Message):
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

class IterationReport(_message.Message):
    __slots__ = ("job_id", "iteration", "loss", "train_accuracy", "test_accuracy", "wall_seconds", "elapsed_seconds", "decode_seconds", "used_workers", "late_workers", "failed_workers", "timings", "exact", "verify_error", "state", "message", "error_bound", "consistency_checks", "suspect_workers", "integrity", "backup_workers", "promoted_workers", "unchecked_workers", "bytes_received", "bytes_sent", "child_timings", "late_children", "start_slack_seconds")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    TRAIN_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    TEST_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    WALL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DECODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    USED_WORKERS_FIELD_NUMBER: _ClassVar[int]
    LATE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    FAILED_WORKERS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    EXACT_FIELD_NUMBER: _ClassVar[int]
    VERIFY_ERROR_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_BOUND_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_CHECKS_FIELD_NUMBER: _ClassVar[int]
    SUSPECT_WORKERS_FIELD_NUMBER: _ClassVar[int]
    INTEGRITY_FIELD_NUMBER: _ClassVar[int]
    BACKUP_WORKERS_FIELD_NUMBER: _ClassVar[int]
    PROMOTED_WORKERS_FIELD_NUMBER: _ClassVar[int]
    UNCHECKED_WORKERS_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    CHILD_TIMINGS_FIELD_NUMBER: _ClassVar[int]
    LATE_CHILDREN_FIELD_NUMBER: _ClassVar[int]
    START_SLACK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    iteration: int
    loss: float
    train_accuracy: float
    test_accuracy: float
    wall_seconds: float
    elapsed_seconds: float
    decode_seconds: float
    used_workers: _containers.RepeatedScalarFieldContainer[int]
    late_workers: _containers.RepeatedScalarFieldContainer[int]
    failed_workers: _containers.RepeatedScalarFieldContainer[int]
    timings: _containers.RepeatedCompositeFieldContainer[WorkerTiming]
    exact: bool
    verify_error: float
    state: JobState
    message: str
    error_bound: float
    consistency_checks: int
    suspect_workers: _containers.RepeatedScalarFieldContainer[int]
    integrity: str
    backup_workers: _containers.RepeatedScalarFieldContainer[int]
    promoted_workers: _containers.RepeatedScalarFieldContainer[int]
    unchecked_workers: _containers.RepeatedScalarFieldContainer[int]
    bytes_received: int
    bytes_sent: int
    child_timings: _containers.RepeatedCompositeFieldContainer[WorkerTiming]
    late_children: _containers.RepeatedScalarFieldContainer[int]
    start_slack_seconds: float
    def __init__(self, job_id: _Optional[str] = ..., iteration: _Optional[int] = ..., loss: _Optional[float] = ..., train_accuracy: _Optional[float] = ..., test_accuracy: _Optional[float] = ..., wall_seconds: _Optional[float] = ..., elapsed_seconds: _Optional[float] = ..., decode_seconds: _Optional[float] = ..., used_workers: _Optional[_Iterable[int]] = ..., late_workers: _Optional[_Iterable[int]] = ..., failed_workers: _Optional[_Iterable[int]] = ..., timings: _Optional[_Iterable[_Union[WorkerTiming, _Mapping]]] = ..., exact: _Optional[bool] = ..., verify_error: _Optional[float] = ..., state: _Optional[_Union[JobState, str]] = ..., message: _Optional[str] = ..., error_bound: _Optional[float] = ..., consistency_checks: _Optional[int] = ..., suspect_workers: _Optional[_Iterable[int]] = ..., integrity: _Optional[str] = ..., backup_workers: _Optional[_Iterable[int]] = ..., promoted_workers: _Optional[_Iterable[int]] = ..., unchecked_workers: _Optional[_Iterable[int]] = ..., bytes_received: _Optional[int] = ..., bytes_sent: _Optional[int] = ..., child_timings: _Optional[_Iterable[_Union[WorkerTiming, _Mapping]]] = ..., late_children: _Optional[_Iterable[int]] = ..., start_slack_seconds: _Optional[float] = ...) -> None: ...

class GetModelRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ModelReply(_message.Message):
    __slots__ = ("job_id", "iteration", "parameters", "model")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    iteration: int
    parameters: _common_pb2.Tensor
    model: _common_pb2.ModelSpec
    def __init__(self, job_id: _Optional[str] = ..., iteration: _Optional[int] = ..., parameters: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., model: _Optional[_Union[_common_pb2.ModelSpec, _Mapping]] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResumeJobRequest(_message.Message):
    __slots__ = ("job_id", "checkpoint")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    checkpoint: bytes
    def __init__(self, job_id: _Optional[str] = ..., checkpoint: _Optional[bytes] = ...) -> None: ...

class ListJobsReply(_message.Message):
    __slots__ = ("jobs", "evicted_job_ids")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    EVICTED_JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobInfo]
    evicted_job_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobInfo, _Mapping]]] = ..., evicted_job_ids: _Optional[_Iterable[str]] = ...) -> None: ...
