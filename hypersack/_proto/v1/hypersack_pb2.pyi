from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WhoAmIRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class User(_message.Message):
    __slots__ = ("name", "role", "created_at", "via", "expires_at")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    VIA_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    created_at: float
    via: str
    expires_at: float
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ..., created_at: _Optional[float] = ..., via: _Optional[str] = ..., expires_at: _Optional[float] = ...) -> None: ...

class AddUserRequest(_message.Message):
    __slots__ = ("name", "role")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ...) -> None: ...

class RemoveUserRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListUsersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListUsersResponse(_message.Message):
    __slots__ = ("users",)
    USERS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[User]
    def __init__(self, users: _Optional[_Iterable[_Union[User, _Mapping]]] = ...) -> None: ...

class Token(_message.Message):
    __slots__ = ("id", "user", "created_at", "revoked_at", "label", "expires_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    REVOKED_AT_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    user: str
    created_at: float
    revoked_at: float
    label: str
    expires_at: float
    def __init__(self, id: _Optional[str] = ..., user: _Optional[str] = ..., created_at: _Optional[float] = ..., revoked_at: _Optional[float] = ..., label: _Optional[str] = ..., expires_at: _Optional[float] = ...) -> None: ...

class CreateTokenRequest(_message.Message):
    __slots__ = ("user", "label", "ttl_s")
    USER_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    user: str
    label: str
    ttl_s: float
    def __init__(self, user: _Optional[str] = ..., label: _Optional[str] = ..., ttl_s: _Optional[float] = ...) -> None: ...

class CreateTokenResponse(_message.Message):
    __slots__ = ("token", "secret")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    token: Token
    secret: str
    def __init__(self, token: _Optional[_Union[Token, _Mapping]] = ..., secret: _Optional[str] = ...) -> None: ...

class ListTokensRequest(_message.Message):
    __slots__ = ("user",)
    USER_FIELD_NUMBER: _ClassVar[int]
    user: str
    def __init__(self, user: _Optional[str] = ...) -> None: ...

class ListTokensResponse(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[Token]
    def __init__(self, tokens: _Optional[_Iterable[_Union[Token, _Mapping]]] = ...) -> None: ...

class RevokeTokenRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class SubmitStudyRequest(_message.Message):
    __slots__ = ("space_yaml", "source")
    SPACE_YAML_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    space_yaml: str
    source: str
    def __init__(self, space_yaml: _Optional[str] = ..., source: _Optional[str] = ...) -> None: ...

class GetStudyRequest(_message.Message):
    __slots__ = ("study_id",)
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    def __init__(self, study_id: _Optional[str] = ...) -> None: ...

class ListStudiesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListStudiesResponse(_message.Message):
    __slots__ = ("studies",)
    STUDIES_FIELD_NUMBER: _ClassVar[int]
    studies: _containers.RepeatedCompositeFieldContainer[Study]
    def __init__(self, studies: _Optional[_Iterable[_Union[Study, _Mapping]]] = ...) -> None: ...

class ListTrialsRequest(_message.Message):
    __slots__ = ("study_id",)
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    def __init__(self, study_id: _Optional[str] = ...) -> None: ...

class ListTrialsResponse(_message.Message):
    __slots__ = ("trials",)
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    trials: _containers.RepeatedCompositeFieldContainer[Trial]
    def __init__(self, trials: _Optional[_Iterable[_Union[Trial, _Mapping]]] = ...) -> None: ...

class GetTrialRequest(_message.Message):
    __slots__ = ("trial_id",)
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    def __init__(self, trial_id: _Optional[str] = ...) -> None: ...

class TrialExplanation(_message.Message):
    __slots__ = ("trial_id", "state", "lines")
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    state: str
    lines: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, trial_id: _Optional[str] = ..., state: _Optional[str] = ..., lines: _Optional[_Iterable[str]] = ...) -> None: ...

class WatchStudyRequest(_message.Message):
    __slots__ = ("study_id", "min_interval_s")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    min_interval_s: float
    def __init__(self, study_id: _Optional[str] = ..., min_interval_s: _Optional[float] = ...) -> None: ...

class CancelStudyRequest(_message.Message):
    __slots__ = ("study_id",)
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    def __init__(self, study_id: _Optional[str] = ...) -> None: ...

class AskTrialsRequest(_message.Message):
    __slots__ = ("study_id", "params_json")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    params_json: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, study_id: _Optional[str] = ..., params_json: _Optional[_Iterable[str]] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes", "sharing")
    NODES_FIELD_NUMBER: _ClassVar[int]
    SHARING_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    sharing: _containers.RepeatedCompositeFieldContainer[SharingLevel]
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., sharing: _Optional[_Iterable[_Union[SharingLevel, _Mapping]]] = ...) -> None: ...

class SharingLevel(_message.Message):
    __slots__ = ("arch", "configured", "ratio", "learning", "samples", "needed", "contention", "saturation_pct", "moves", "queued", "workloads", "foresight")
    ARCH_FIELD_NUMBER: _ClassVar[int]
    CONFIGURED_FIELD_NUMBER: _ClassVar[int]
    RATIO_FIELD_NUMBER: _ClassVar[int]
    LEARNING_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    NEEDED_FIELD_NUMBER: _ClassVar[int]
    CONTENTION_FIELD_NUMBER: _ClassVar[int]
    SATURATION_PCT_FIELD_NUMBER: _ClassVar[int]
    MOVES_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    WORKLOADS_FIELD_NUMBER: _ClassVar[int]
    FORESIGHT_FIELD_NUMBER: _ClassVar[int]
    arch: str
    configured: float
    ratio: float
    learning: bool
    samples: int
    needed: int
    contention: float
    saturation_pct: float
    moves: int
    queued: float
    workloads: _containers.RepeatedCompositeFieldContainer[WorkloadFit]
    foresight: str
    def __init__(self, arch: _Optional[str] = ..., configured: _Optional[float] = ..., ratio: _Optional[float] = ..., learning: bool = ..., samples: _Optional[int] = ..., needed: _Optional[int] = ..., contention: _Optional[float] = ..., saturation_pct: _Optional[float] = ..., moves: _Optional[int] = ..., queued: _Optional[float] = ..., workloads: _Optional[_Iterable[_Union[WorkloadFit, _Mapping]]] = ..., foresight: _Optional[str] = ...) -> None: ...

class WorkloadFit(_message.Message):
    __slots__ = ("workload", "samples", "contention", "saturation_pct", "queued")
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    CONTENTION_FIELD_NUMBER: _ClassVar[int]
    SATURATION_PCT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    workload: str
    samples: int
    contention: float
    saturation_pct: float
    queued: float
    def __init__(self, workload: _Optional[str] = ..., samples: _Optional[int] = ..., contention: _Optional[float] = ..., saturation_pct: _Optional[float] = ..., queued: _Optional[float] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: str
    def __init__(self, node: _Optional[str] = ...) -> None: ...

class ListProfilesRequest(_message.Message):
    __slots__ = ("model", "arch")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    model: str
    arch: str
    def __init__(self, model: _Optional[str] = ..., arch: _Optional[str] = ...) -> None: ...

class ListProfilesResponse(_message.Message):
    __slots__ = ("profiles",)
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    profiles: _containers.RepeatedCompositeFieldContainer[ProfileRecord]
    def __init__(self, profiles: _Optional[_Iterable[_Union[ProfileRecord, _Mapping]]] = ...) -> None: ...

class ImportProfilesRequest(_message.Message):
    __slots__ = ("profiles", "replace")
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    profiles: _containers.RepeatedCompositeFieldContainer[ProfileRecord]
    replace: bool
    def __init__(self, profiles: _Optional[_Iterable[_Union[ProfileRecord, _Mapping]]] = ..., replace: bool = ...) -> None: ...

class ForgetProfilesRequest(_message.Message):
    __slots__ = ("model", "arch")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    model: str
    arch: str
    def __init__(self, model: _Optional[str] = ..., arch: _Optional[str] = ...) -> None: ...

class ForgetProfilesResponse(_message.Message):
    __slots__ = ("forgotten",)
    FORGOTTEN_FIELD_NUMBER: _ClassVar[int]
    forgotten: int
    def __init__(self, forgotten: _Optional[int] = ...) -> None: ...

class ImportProfilesResponse(_message.Message):
    __slots__ = ("imported", "kept")
    IMPORTED_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    imported: int
    kept: int
    def __init__(self, imported: _Optional[int] = ..., kept: _Optional[int] = ...) -> None: ...

class Study(_message.Message):
    __slots__ = ("id", "name", "state", "submitted_at", "counts", "space_json", "objective_metric", "objective_mode", "owner", "warnings", "planned", "objective_metrics", "objective_modes")
    class CountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    SPACE_JSON_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_METRIC_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_MODE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    PLANNED_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_METRICS_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_MODES_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    state: str
    submitted_at: float
    counts: _containers.ScalarMap[str, int]
    space_json: str
    objective_metric: str
    objective_mode: str
    owner: str
    warnings: _containers.RepeatedScalarFieldContainer[str]
    planned: int
    objective_metrics: _containers.RepeatedScalarFieldContainer[str]
    objective_modes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[str] = ..., submitted_at: _Optional[float] = ..., counts: _Optional[_Mapping[str, int]] = ..., space_json: _Optional[str] = ..., objective_metric: _Optional[str] = ..., objective_mode: _Optional[str] = ..., owner: _Optional[str] = ..., warnings: _Optional[_Iterable[str]] = ..., planned: _Optional[int] = ..., objective_metrics: _Optional[_Iterable[str]] = ..., objective_modes: _Optional[_Iterable[str]] = ...) -> None: ...

class Trial(_message.Message):
    __slots__ = ("id", "study_id", "state", "params_json", "workload", "node", "gpu_index", "failures", "launches", "metrics", "has_objective", "objective", "reason", "log_tail", "started_at", "finished_at", "fused_group", "fusion_width", "epoch", "has_last_value", "last_value")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    LAUNCHES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    HAS_OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LOG_TAIL_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    FUSED_GROUP_FIELD_NUMBER: _ClassVar[int]
    FUSION_WIDTH_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HAS_LAST_VALUE_FIELD_NUMBER: _ClassVar[int]
    LAST_VALUE_FIELD_NUMBER: _ClassVar[int]
    id: str
    study_id: str
    state: str
    params_json: str
    workload: str
    node: str
    gpu_index: int
    failures: int
    launches: int
    metrics: _containers.ScalarMap[str, float]
    has_objective: bool
    objective: float
    reason: str
    log_tail: str
    started_at: float
    finished_at: float
    fused_group: str
    fusion_width: int
    epoch: int
    has_last_value: bool
    last_value: float
    def __init__(self, id: _Optional[str] = ..., study_id: _Optional[str] = ..., state: _Optional[str] = ..., params_json: _Optional[str] = ..., workload: _Optional[str] = ..., node: _Optional[str] = ..., gpu_index: _Optional[int] = ..., failures: _Optional[int] = ..., launches: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., has_objective: bool = ..., objective: _Optional[float] = ..., reason: _Optional[str] = ..., log_tail: _Optional[str] = ..., started_at: _Optional[float] = ..., finished_at: _Optional[float] = ..., fused_group: _Optional[str] = ..., fusion_width: _Optional[int] = ..., epoch: _Optional[int] = ..., has_last_value: bool = ..., last_value: _Optional[float] = ...) -> None: ...

class ExtendStudyRequest(_message.Message):
    __slots__ = ("study_id", "trials")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    trials: int
    def __init__(self, study_id: _Optional[str] = ..., trials: _Optional[int] = ...) -> None: ...

class GetHistoryRequest(_message.Message):
    __slots__ = ("study_id", "trial_id", "after_trial", "after_step")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_TRIAL_FIELD_NUMBER: _ClassVar[int]
    AFTER_STEP_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    trial_id: str
    after_trial: str
    after_step: int
    def __init__(self, study_id: _Optional[str] = ..., trial_id: _Optional[str] = ..., after_trial: _Optional[str] = ..., after_step: _Optional[int] = ...) -> None: ...

class HistoryStep(_message.Message):
    __slots__ = ("trial_id", "step", "at", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    step: int
    at: float
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, trial_id: _Optional[str] = ..., step: _Optional[int] = ..., at: _Optional[float] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class Span(_message.Message):
    __slots__ = ("trial_id", "attempt", "node", "gpu_index", "start", "end", "group")
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    attempt: int
    node: str
    gpu_index: int
    start: float
    end: float
    group: str
    def __init__(self, trial_id: _Optional[str] = ..., attempt: _Optional[int] = ..., node: _Optional[str] = ..., gpu_index: _Optional[int] = ..., start: _Optional[float] = ..., end: _Optional[float] = ..., group: _Optional[str] = ...) -> None: ...

class History(_message.Message):
    __slots__ = ("steps", "spans", "more")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[HistoryStep]
    spans: _containers.RepeatedCompositeFieldContainer[Span]
    more: bool
    def __init__(self, steps: _Optional[_Iterable[_Union[HistoryStep, _Mapping]]] = ..., spans: _Optional[_Iterable[_Union[Span, _Mapping]]] = ..., more: bool = ...) -> None: ...

class GpuLoad(_message.Message):
    __slots__ = ("node", "gpu_index", "trials", "compute_share")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SHARE_FIELD_NUMBER: _ClassVar[int]
    node: str
    gpu_index: int
    trials: int
    compute_share: float
    def __init__(self, node: _Optional[str] = ..., gpu_index: _Optional[int] = ..., trials: _Optional[int] = ..., compute_share: _Optional[float] = ...) -> None: ...

class StudyUpdate(_message.Message):
    __slots__ = ("study", "gpus")
    STUDY_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    study: Study
    gpus: _containers.RepeatedCompositeFieldContainer[GpuLoad]
    def __init__(self, study: _Optional[_Union[Study, _Mapping]] = ..., gpus: _Optional[_Iterable[_Union[GpuLoad, _Mapping]]] = ...) -> None: ...

class Gpu(_message.Message):
    __slots__ = ("index", "arch", "memory_mib", "uuid", "trials", "compute_share", "utilization_pct", "memory_used_mib", "sharing", "mps_restarts")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SHARE_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_PCT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_MIB_FIELD_NUMBER: _ClassVar[int]
    SHARING_FIELD_NUMBER: _ClassVar[int]
    MPS_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    arch: str
    memory_mib: int
    uuid: str
    trials: int
    compute_share: float
    utilization_pct: float
    memory_used_mib: int
    sharing: str
    mps_restarts: int
    def __init__(self, index: _Optional[int] = ..., arch: _Optional[str] = ..., memory_mib: _Optional[int] = ..., uuid: _Optional[str] = ..., trials: _Optional[int] = ..., compute_share: _Optional[float] = ..., utilization_pct: _Optional[float] = ..., memory_used_mib: _Optional[int] = ..., sharing: _Optional[str] = ..., mps_restarts: _Optional[int] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("name", "cores", "draining", "connected", "last_seen_s", "gpus", "backend")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CORES_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_S_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    name: str
    cores: float
    draining: bool
    connected: bool
    last_seen_s: float
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    backend: str
    def __init__(self, name: _Optional[str] = ..., cores: _Optional[float] = ..., draining: bool = ..., connected: bool = ..., last_seen_s: _Optional[float] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., backend: _Optional[str] = ...) -> None: ...

class WorkloadKey(_message.Message):
    __slots__ = ("model", "batch_size", "optimizer", "precision", "fusion_width", "params")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    FUSION_WIDTH_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    model: str
    batch_size: int
    optimizer: str
    precision: str
    fusion_width: int
    params: str
    def __init__(self, model: _Optional[str] = ..., batch_size: _Optional[int] = ..., optimizer: _Optional[str] = ..., precision: _Optional[str] = ..., fusion_width: _Optional[int] = ..., params: _Optional[str] = ...) -> None: ...

class GpuInfo(_message.Message):
    __slots__ = ("index", "arch", "memory_mib", "uuid")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    index: int
    arch: str
    memory_mib: int
    uuid: str
    def __init__(self, index: _Optional[int] = ..., arch: _Optional[str] = ..., memory_mib: _Optional[int] = ..., uuid: _Optional[str] = ...) -> None: ...

class GpuState(_message.Message):
    __slots__ = ("index", "utilization_pct", "memory_used_mib", "sharing", "mps_restarts")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_PCT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_MIB_FIELD_NUMBER: _ClassVar[int]
    SHARING_FIELD_NUMBER: _ClassVar[int]
    MPS_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    utilization_pct: float
    memory_used_mib: int
    sharing: str
    mps_restarts: int
    def __init__(self, index: _Optional[int] = ..., utilization_pct: _Optional[float] = ..., memory_used_mib: _Optional[int] = ..., sharing: _Optional[str] = ..., mps_restarts: _Optional[int] = ...) -> None: ...

class RunningTrial(_message.Message):
    __slots__ = ("trial_id", "gpu_index", "peak_memory_mib", "peak_utilization_pct", "attempt")
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    PEAK_UTILIZATION_PCT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    gpu_index: int
    peak_memory_mib: int
    peak_utilization_pct: float
    attempt: int
    def __init__(self, trial_id: _Optional[str] = ..., gpu_index: _Optional[int] = ..., peak_memory_mib: _Optional[int] = ..., peak_utilization_pct: _Optional[float] = ..., attempt: _Optional[int] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("node", "cores", "gpus", "running", "backend", "version", "owner", "folded_acks", "held_acks", "batched")
    NODE_FIELD_NUMBER: _ClassVar[int]
    CORES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    FOLDED_ACKS_FIELD_NUMBER: _ClassVar[int]
    HELD_ACKS_FIELD_NUMBER: _ClassVar[int]
    BATCHED_FIELD_NUMBER: _ClassVar[int]
    node: str
    cores: float
    gpus: _containers.RepeatedCompositeFieldContainer[GpuInfo]
    running: _containers.RepeatedCompositeFieldContainer[RunningTrial]
    backend: str
    version: str
    owner: str
    folded_acks: bool
    held_acks: bool
    batched: bool
    def __init__(self, node: _Optional[str] = ..., cores: _Optional[float] = ..., gpus: _Optional[_Iterable[_Union[GpuInfo, _Mapping]]] = ..., running: _Optional[_Iterable[_Union[RunningTrial, _Mapping]]] = ..., backend: _Optional[str] = ..., version: _Optional[str] = ..., owner: _Optional[str] = ..., folded_acks: bool = ..., held_acks: bool = ..., batched: bool = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("running", "gpus", "seq", "processed")
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PROCESSED_FIELD_NUMBER: _ClassVar[int]
    running: _containers.RepeatedCompositeFieldContainer[RunningTrial]
    gpus: _containers.RepeatedCompositeFieldContainer[GpuState]
    seq: int
    processed: int
    def __init__(self, running: _Optional[_Iterable[_Union[RunningTrial, _Mapping]]] = ..., gpus: _Optional[_Iterable[_Union[GpuState, _Mapping]]] = ..., seq: _Optional[int] = ..., processed: _Optional[int] = ...) -> None: ...

class TrialStarted(_message.Message):
    __slots__ = ("trial_id", "attempt")
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    attempt: int
    def __init__(self, trial_id: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class StepMetrics(_message.Message):
    __slots__ = ("step", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    step: int
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, step: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class TrialMetrics(_message.Message):
    __slots__ = ("trial_id", "step", "metrics", "attempt", "steps", "iter_time_s", "iter_window_s")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    ITER_TIME_S_FIELD_NUMBER: _ClassVar[int]
    ITER_WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    step: int
    metrics: _containers.ScalarMap[str, float]
    attempt: int
    steps: _containers.RepeatedCompositeFieldContainer[StepMetrics]
    iter_time_s: float
    iter_window_s: float
    def __init__(self, trial_id: _Optional[str] = ..., step: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., attempt: _Optional[int] = ..., steps: _Optional[_Iterable[_Union[StepMetrics, _Mapping]]] = ..., iter_time_s: _Optional[float] = ..., iter_window_s: _Optional[float] = ...) -> None: ...

class TrialExited(_message.Message):
    __slots__ = ("trial_id", "exit_code", "log_tail", "metrics", "out_of_memory", "peak_memory_mib", "attempt", "fenced", "killed")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    LOG_TAIL_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    OUT_OF_MEMORY_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    KILLED_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    exit_code: int
    log_tail: str
    metrics: _containers.ScalarMap[str, float]
    out_of_memory: bool
    peak_memory_mib: int
    attempt: int
    fenced: bool
    killed: bool
    def __init__(self, trial_id: _Optional[str] = ..., exit_code: _Optional[int] = ..., log_tail: _Optional[str] = ..., metrics: _Optional[_Mapping[str, float]] = ..., out_of_memory: bool = ..., peak_memory_mib: _Optional[int] = ..., attempt: _Optional[int] = ..., fenced: bool = ..., killed: bool = ...) -> None: ...

class ProfileRecord(_message.Message):
    __slots__ = ("key", "arch", "compute_pct", "memory_mib", "cores", "iter_time_s", "iters_per_epoch", "data_fraction", "source", "setup_s", "eval_s_per_epoch", "versions", "measured_at", "observed_memory_mib", "observed_compute_pct", "observed_trials", "corrected")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_PCT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    CORES_FIELD_NUMBER: _ClassVar[int]
    ITER_TIME_S_FIELD_NUMBER: _ClassVar[int]
    ITERS_PER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    DATA_FRACTION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SETUP_S_FIELD_NUMBER: _ClassVar[int]
    EVAL_S_PER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    MEASURED_AT_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_COMPUTE_PCT_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_TRIALS_FIELD_NUMBER: _ClassVar[int]
    CORRECTED_FIELD_NUMBER: _ClassVar[int]
    key: WorkloadKey
    arch: str
    compute_pct: float
    memory_mib: int
    cores: float
    iter_time_s: float
    iters_per_epoch: int
    data_fraction: float
    source: str
    setup_s: float
    eval_s_per_epoch: float
    versions: str
    measured_at: float
    observed_memory_mib: int
    observed_compute_pct: float
    observed_trials: int
    corrected: str
    def __init__(self, key: _Optional[_Union[WorkloadKey, _Mapping]] = ..., arch: _Optional[str] = ..., compute_pct: _Optional[float] = ..., memory_mib: _Optional[int] = ..., cores: _Optional[float] = ..., iter_time_s: _Optional[float] = ..., iters_per_epoch: _Optional[int] = ..., data_fraction: _Optional[float] = ..., source: _Optional[str] = ..., setup_s: _Optional[float] = ..., eval_s_per_epoch: _Optional[float] = ..., versions: _Optional[str] = ..., measured_at: _Optional[float] = ..., observed_memory_mib: _Optional[int] = ..., observed_compute_pct: _Optional[float] = ..., observed_trials: _Optional[int] = ..., corrected: _Optional[str] = ...) -> None: ...

class ProfileResult(_message.Message):
    __slots__ = ("key", "arch", "ok", "error", "profile", "sample")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    key: WorkloadKey
    arch: str
    ok: bool
    error: str
    profile: ProfileRecord
    sample: str
    def __init__(self, key: _Optional[_Union[WorkloadKey, _Mapping]] = ..., arch: _Optional[str] = ..., ok: bool = ..., error: _Optional[str] = ..., profile: _Optional[_Union[ProfileRecord, _Mapping]] = ..., sample: _Optional[str] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("register", "heartbeat", "started", "metrics", "exited", "profile")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    register: Register
    heartbeat: Heartbeat
    started: TrialStarted
    metrics: TrialMetrics
    exited: TrialExited
    profile: ProfileResult
    def __init__(self, register: _Optional[_Union[Register, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., started: _Optional[_Union[TrialStarted, _Mapping]] = ..., metrics: _Optional[_Union[TrialMetrics, _Mapping]] = ..., exited: _Optional[_Union[TrialExited, _Mapping]] = ..., profile: _Optional[_Union[ProfileResult, _Mapping]] = ...) -> None: ...

class Program(_message.Message):
    __slots__ = ("builtin", "command", "options_json", "preload")
    BUILTIN_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_JSON_FIELD_NUMBER: _ClassVar[int]
    PRELOAD_FIELD_NUMBER: _ClassVar[int]
    builtin: str
    command: str
    options_json: str
    preload: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, builtin: _Optional[str] = ..., command: _Optional[str] = ..., options_json: _Optional[str] = ..., preload: _Optional[_Iterable[str]] = ...) -> None: ...

class Registered(_message.Message):
    __slots__ = ("heartbeat_interval_s", "heartbeat_timeout_s")
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    def __init__(self, heartbeat_interval_s: _Optional[float] = ..., heartbeat_timeout_s: _Optional[float] = ...) -> None: ...

class LaunchTrial(_message.Message):
    __slots__ = ("trial_id", "study_id", "gpu_index", "params_json", "key", "epochs", "program", "compute_pct", "memory_mib", "cores", "attempt", "owner", "stop_at_epoch", "done_epochs")
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_PCT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    CORES_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    STOP_AT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    DONE_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    study_id: str
    gpu_index: int
    params_json: str
    key: WorkloadKey
    epochs: float
    program: Program
    compute_pct: float
    memory_mib: int
    cores: float
    attempt: int
    owner: str
    stop_at_epoch: float
    done_epochs: float
    def __init__(self, trial_id: _Optional[str] = ..., study_id: _Optional[str] = ..., gpu_index: _Optional[int] = ..., params_json: _Optional[str] = ..., key: _Optional[_Union[WorkloadKey, _Mapping]] = ..., epochs: _Optional[float] = ..., program: _Optional[_Union[Program, _Mapping]] = ..., compute_pct: _Optional[float] = ..., memory_mib: _Optional[int] = ..., cores: _Optional[float] = ..., attempt: _Optional[int] = ..., owner: _Optional[str] = ..., stop_at_epoch: _Optional[float] = ..., done_epochs: _Optional[float] = ...) -> None: ...

class LaunchGroup(_message.Message):
    __slots__ = ("group_id", "gpu_index", "key", "compute_pct", "memory_mib", "cores", "members")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_PCT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    CORES_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    gpu_index: int
    key: WorkloadKey
    compute_pct: float
    memory_mib: int
    cores: float
    members: _containers.RepeatedCompositeFieldContainer[LaunchTrial]
    def __init__(self, group_id: _Optional[str] = ..., gpu_index: _Optional[int] = ..., key: _Optional[_Union[WorkloadKey, _Mapping]] = ..., compute_pct: _Optional[float] = ..., memory_mib: _Optional[int] = ..., cores: _Optional[float] = ..., members: _Optional[_Iterable[_Union[LaunchTrial, _Mapping]]] = ...) -> None: ...

class KillTrial(_message.Message):
    __slots__ = ("trial_id", "reason", "attempt")
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    reason: str
    attempt: int
    def __init__(self, trial_id: _Optional[str] = ..., reason: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class ProfileWorkload(_message.Message):
    __slots__ = ("key", "arch", "gpu_index", "iterations", "warmup", "program", "params_json", "epochs", "owner", "sample")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    WARMUP_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    key: WorkloadKey
    arch: str
    gpu_index: int
    iterations: int
    warmup: int
    program: Program
    params_json: str
    epochs: float
    owner: str
    sample: str
    def __init__(self, key: _Optional[_Union[WorkloadKey, _Mapping]] = ..., arch: _Optional[str] = ..., gpu_index: _Optional[int] = ..., iterations: _Optional[int] = ..., warmup: _Optional[int] = ..., program: _Optional[_Union[Program, _Mapping]] = ..., params_json: _Optional[str] = ..., epochs: _Optional[float] = ..., owner: _Optional[str] = ..., sample: _Optional[str] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ("registered", "launch", "kill", "profile", "launch_group", "drop_checkpoint", "acked", "acks", "more")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    KILL_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_GROUP_FIELD_NUMBER: _ClassVar[int]
    DROP_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    registered: Registered
    launch: LaunchTrial
    kill: KillTrial
    profile: ProfileWorkload
    launch_group: LaunchGroup
    drop_checkpoint: DropCheckpoint
    acked: Acked
    acks: _containers.RepeatedScalarFieldContainer[str]
    more: _containers.RepeatedCompositeFieldContainer[ServerMessage]
    def __init__(self, registered: _Optional[_Union[Registered, _Mapping]] = ..., launch: _Optional[_Union[LaunchTrial, _Mapping]] = ..., kill: _Optional[_Union[KillTrial, _Mapping]] = ..., profile: _Optional[_Union[ProfileWorkload, _Mapping]] = ..., launch_group: _Optional[_Union[LaunchGroup, _Mapping]] = ..., drop_checkpoint: _Optional[_Union[DropCheckpoint, _Mapping]] = ..., acked: _Optional[_Union[Acked, _Mapping]] = ..., acks: _Optional[_Iterable[str]] = ..., more: _Optional[_Iterable[_Union[ServerMessage, _Mapping]]] = ...) -> None: ...

class Acked(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class DropCheckpoint(_message.Message):
    __slots__ = ("trial_id", "study_id")
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    study_id: str
    def __init__(self, trial_id: _Optional[str] = ..., study_id: _Optional[str] = ...) -> None: ...
