from google.protobuf import struct_pb2 as _struct_pb2
from gradcheck.v1 import graph_pb2 as _graph_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class VerifyOptions(_message.Message):
    __slots__ = ("fd_mode", "dtype", "device", "atol", "rtol", "directions", "seed", "faults", "symbolic_budget", "localize", "checkpoint", "integrity", "allow_inplace_hazards", "symbolic", "allow_nonfinite", "memory_timeline", "memory_profile", "optimizer", "optimizer_dtype", "fd_method")
    FD_MODE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    ATOL_FIELD_NUMBER: _ClassVar[int]
    RTOL_FIELD_NUMBER: _ClassVar[int]
    DIRECTIONS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    FAULTS_FIELD_NUMBER: _ClassVar[int]
    SYMBOLIC_BUDGET_FIELD_NUMBER: _ClassVar[int]
    LOCALIZE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    INTEGRITY_FIELD_NUMBER: _ClassVar[int]
    ALLOW_INPLACE_HAZARDS_FIELD_NUMBER: _ClassVar[int]
    SYMBOLIC_FIELD_NUMBER: _ClassVar[int]
    ALLOW_NONFINITE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TIMELINE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PROFILE_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_DTYPE_FIELD_NUMBER: _ClassVar[int]
    FD_METHOD_FIELD_NUMBER: _ClassVar[int]
    fd_mode: str
    dtype: str
    device: str
    atol: float
    rtol: float
    directions: int
    seed: int
    faults: _containers.RepeatedScalarFieldContainer[str]
    symbolic_budget: int
    localize: bool
    checkpoint: str
    integrity: str
    allow_inplace_hazards: bool
    symbolic: bool
    allow_nonfinite: bool
    memory_timeline: bool
    memory_profile: bool
    optimizer: str
    optimizer_dtype: str
    fd_method: str
    def __init__(self, fd_mode: _Optional[str] = ..., dtype: _Optional[str] = ..., device: _Optional[str] = ..., atol: _Optional[float] = ..., rtol: _Optional[float] = ..., directions: _Optional[int] = ..., seed: _Optional[int] = ..., faults: _Optional[_Iterable[str]] = ..., symbolic_budget: _Optional[int] = ..., localize: _Optional[bool] = ..., checkpoint: _Optional[str] = ..., integrity: _Optional[str] = ..., allow_inplace_hazards: _Optional[bool] = ..., symbolic: _Optional[bool] = ..., allow_nonfinite: _Optional[bool] = ..., memory_timeline: _Optional[bool] = ..., memory_profile: _Optional[bool] = ..., optimizer: _Optional[str] = ..., optimizer_dtype: _Optional[str] = ..., fd_method: _Optional[str] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("id", "graph", "options", "onnx_model", "onnx")
    ID_FIELD_NUMBER: _ClassVar[int]
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    ONNX_MODEL_FIELD_NUMBER: _ClassVar[int]
    ONNX_FIELD_NUMBER: _ClassVar[int]
    id: str
    graph: _graph_pb2.Graph
    options: VerifyOptions
    onnx_model: bytes
    onnx: OnnxImport
    def __init__(self, id: _Optional[str] = ..., graph: _Optional[_Union[_graph_pb2.Graph, _Mapping]] = ..., options: _Optional[_Union[VerifyOptions, _Mapping]] = ..., onnx_model: _Optional[bytes] = ..., onnx: _Optional[_Union[OnnxImport, _Mapping]] = ...) -> None: ...

class OnnxImport(_message.Message):
    __slots__ = ("params", "inputs", "input_seed", "loss_output", "loss", "cotangent", "cotangent_seed")
    class InputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    INPUT_SEED_FIELD_NUMBER: _ClassVar[int]
    LOSS_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    COTANGENT_FIELD_NUMBER: _ClassVar[int]
    COTANGENT_SEED_FIELD_NUMBER: _ClassVar[int]
    params: str
    inputs: _containers.ScalarMap[str, bytes]
    input_seed: int
    loss_output: str
    loss: str
    cotangent: bytes
    cotangent_seed: int
    def __init__(self, params: _Optional[str] = ..., inputs: _Optional[_Mapping[str, bytes]] = ..., input_seed: _Optional[int] = ..., loss_output: _Optional[str] = ..., loss: _Optional[str] = ..., cotangent: _Optional[bytes] = ..., cotangent_seed: _Optional[int] = ...) -> None: ...

class VerifyError(_message.Message):
    __slots__ = ("code", "message", "field", "kind")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    field: str
    kind: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., field: _Optional[str] = ..., kind: _Optional[str] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ("id", "report", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: str
    report: Report
    error: VerifyError
    def __init__(self, id: _Optional[str] = ..., report: _Optional[_Union[Report, _Mapping]] = ..., error: _Optional[_Union[VerifyError, _Mapping]] = ...) -> None: ...

class Tolerance(_message.Message):
    __slots__ = ("atol", "rtol", "absolute")
    ATOL_FIELD_NUMBER: _ClassVar[int]
    RTOL_FIELD_NUMBER: _ClassVar[int]
    ABSOLUTE_FIELD_NUMBER: _ClassVar[int]
    atol: float
    rtol: float
    absolute: float
    def __init__(self, atol: _Optional[float] = ..., rtol: _Optional[float] = ..., absolute: _Optional[float] = ...) -> None: ...

class SymbolicComparison(_message.Message):
    __slots__ = ("gradient", "max_abs_error", "max_rel_error", "worst_index", "engine_at_worst", "symbolic_at_worst", "passed")
    GRADIENT_FIELD_NUMBER: _ClassVar[int]
    MAX_ABS_ERROR_FIELD_NUMBER: _ClassVar[int]
    MAX_REL_ERROR_FIELD_NUMBER: _ClassVar[int]
    WORST_INDEX_FIELD_NUMBER: _ClassVar[int]
    ENGINE_AT_WORST_FIELD_NUMBER: _ClassVar[int]
    SYMBOLIC_AT_WORST_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    gradient: _containers.RepeatedScalarFieldContainer[float]
    max_abs_error: float
    max_rel_error: float
    worst_index: _containers.RepeatedScalarFieldContainer[int]
    engine_at_worst: float
    symbolic_at_worst: float
    passed: bool
    def __init__(self, gradient: _Optional[_Iterable[float]] = ..., max_abs_error: _Optional[float] = ..., max_rel_error: _Optional[float] = ..., worst_index: _Optional[_Iterable[int]] = ..., engine_at_worst: _Optional[float] = ..., symbolic_at_worst: _Optional[float] = ..., passed: _Optional[bool] = ...) -> None: ...

class FdVsSymbolic(_message.Message):
    __slots__ = ("max_abs_error", "max_rel_error", "worst_index", "fd_at_worst", "symbolic_at_worst", "agree")
    MAX_ABS_ERROR_FIELD_NUMBER: _ClassVar[int]
    MAX_REL_ERROR_FIELD_NUMBER: _ClassVar[int]
    WORST_INDEX_FIELD_NUMBER: _ClassVar[int]
    FD_AT_WORST_FIELD_NUMBER: _ClassVar[int]
    SYMBOLIC_AT_WORST_FIELD_NUMBER: _ClassVar[int]
    AGREE_FIELD_NUMBER: _ClassVar[int]
    max_abs_error: float
    max_rel_error: float
    worst_index: _containers.RepeatedScalarFieldContainer[int]
    fd_at_worst: float
    symbolic_at_worst: float
    agree: bool
    def __init__(self, max_abs_error: _Optional[float] = ..., max_rel_error: _Optional[float] = ..., worst_index: _Optional[_Iterable[int]] = ..., fd_at_worst: _Optional[float] = ..., symbolic_at_worst: _Optional[float] = ..., agree: _Optional[bool] = ...) -> None: ...

class SymbolicSummary(_message.Message):
    __slots__ = ("status", "elements", "edges", "seconds", "digits", "reason")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    DIGITS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    status: str
    elements: int
    edges: int
    seconds: float
    digits: int
    reason: str
    def __init__(self, status: _Optional[str] = ..., elements: _Optional[int] = ..., edges: _Optional[int] = ..., seconds: _Optional[float] = ..., digits: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class FDPlan(_message.Message):
    __slots__ = ("mode", "parameters", "directions", "forwards", "values", "forward_values", "whole_graph_evaluations", "method", "method_fallback", "directions_why", "stand_in")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class MethodEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class MethodFallbackEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class StandInEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MODE_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    DIRECTIONS_FIELD_NUMBER: _ClassVar[int]
    FORWARDS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    FORWARD_VALUES_FIELD_NUMBER: _ClassVar[int]
    WHOLE_GRAPH_EVALUATIONS_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    METHOD_FALLBACK_FIELD_NUMBER: _ClassVar[int]
    DIRECTIONS_WHY_FIELD_NUMBER: _ClassVar[int]
    STAND_IN_FIELD_NUMBER: _ClassVar[int]
    mode: str
    parameters: _containers.ScalarMap[str, int]
    directions: int
    forwards: int
    values: float
    forward_values: int
    whole_graph_evaluations: float
    method: _containers.ScalarMap[str, str]
    method_fallback: _containers.ScalarMap[str, str]
    directions_why: str
    stand_in: _containers.ScalarMap[str, str]
    def __init__(self, mode: _Optional[str] = ..., parameters: _Optional[_Mapping[str, int]] = ..., directions: _Optional[int] = ..., forwards: _Optional[int] = ..., values: _Optional[float] = ..., forward_values: _Optional[int] = ..., whole_graph_evaluations: _Optional[float] = ..., method: _Optional[_Mapping[str, str]] = ..., method_fallback: _Optional[_Mapping[str, str]] = ..., directions_why: _Optional[str] = ..., stand_in: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CustomOpInput(_message.Message):
    __slots__ = ("sympy_grad", "counterexample", "symbolic")
    SYMPY_GRAD_FIELD_NUMBER: _ClassVar[int]
    COUNTEREXAMPLE_FIELD_NUMBER: _ClassVar[int]
    SYMBOLIC_FIELD_NUMBER: _ClassVar[int]
    sympy_grad: str
    counterexample: str
    symbolic: str
    def __init__(self, sympy_grad: _Optional[str] = ..., counterexample: _Optional[str] = ..., symbolic: _Optional[str] = ...) -> None: ...

class CustomOp(_message.Message):
    __slots__ = ("node", "inputs", "args", "formula", "user_grad", "user_grad_matches", "detail", "per_input")
    class UserGradEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class PerInputEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: CustomOpInput
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[CustomOpInput, _Mapping]] = ...) -> None: ...
    NODE_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    FORMULA_FIELD_NUMBER: _ClassVar[int]
    USER_GRAD_FIELD_NUMBER: _ClassVar[int]
    USER_GRAD_MATCHES_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    PER_INPUT_FIELD_NUMBER: _ClassVar[int]
    node: str
    inputs: _containers.RepeatedScalarFieldContainer[str]
    args: _containers.RepeatedScalarFieldContainer[str]
    formula: str
    user_grad: _containers.ScalarMap[str, str]
    user_grad_matches: bool
    detail: str
    per_input: _containers.MessageMap[str, CustomOpInput]
    def __init__(self, node: _Optional[str] = ..., inputs: _Optional[_Iterable[str]] = ..., args: _Optional[_Iterable[str]] = ..., formula: _Optional[str] = ..., user_grad: _Optional[_Mapping[str, str]] = ..., user_grad_matches: _Optional[bool] = ..., detail: _Optional[str] = ..., per_input: _Optional[_Mapping[str, CustomOpInput]] = ...) -> None: ...

class ParameterResult(_message.Message):
    __slots__ = ("name", "shape", "fd_mode", "gradient", "reference", "max_abs_error", "max_rel_error", "worst_index", "engine_at_worst", "reference_at_worst", "tolerance", "passed", "gradient_norm", "fd_evaluations", "truncated", "engine_projection", "symbolic", "fd_vs_symbolic", "fd_passed", "verdict_reference", "fd_error", "fd_error_at_worst", "fd_refined", "fd_undecidable", "status", "explained_by", "failed_by", "fd_checked_by", "source_names", "fd_unconfirmed", "claim", "vs_engine")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    FD_MODE_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    MAX_ABS_ERROR_FIELD_NUMBER: _ClassVar[int]
    MAX_REL_ERROR_FIELD_NUMBER: _ClassVar[int]
    WORST_INDEX_FIELD_NUMBER: _ClassVar[int]
    ENGINE_AT_WORST_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_AT_WORST_FIELD_NUMBER: _ClassVar[int]
    TOLERANCE_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_NORM_FIELD_NUMBER: _ClassVar[int]
    FD_EVALUATIONS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ENGINE_PROJECTION_FIELD_NUMBER: _ClassVar[int]
    SYMBOLIC_FIELD_NUMBER: _ClassVar[int]
    FD_VS_SYMBOLIC_FIELD_NUMBER: _ClassVar[int]
    FD_PASSED_FIELD_NUMBER: _ClassVar[int]
    VERDICT_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    FD_ERROR_FIELD_NUMBER: _ClassVar[int]
    FD_ERROR_AT_WORST_FIELD_NUMBER: _ClassVar[int]
    FD_REFINED_FIELD_NUMBER: _ClassVar[int]
    FD_UNDECIDABLE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EXPLAINED_BY_FIELD_NUMBER: _ClassVar[int]
    FAILED_BY_FIELD_NUMBER: _ClassVar[int]
    FD_CHECKED_BY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_NAMES_FIELD_NUMBER: _ClassVar[int]
    FD_UNCONFIRMED_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    VS_ENGINE_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    fd_mode: str
    gradient: _containers.RepeatedScalarFieldContainer[float]
    reference: _containers.RepeatedScalarFieldContainer[float]
    max_abs_error: float
    max_rel_error: float
    worst_index: _containers.RepeatedScalarFieldContainer[int]
    engine_at_worst: float
    reference_at_worst: float
    tolerance: Tolerance
    passed: bool
    gradient_norm: float
    fd_evaluations: int
    truncated: bool
    engine_projection: _containers.RepeatedScalarFieldContainer[float]
    symbolic: SymbolicComparison
    fd_vs_symbolic: FdVsSymbolic
    fd_passed: bool
    verdict_reference: str
    fd_error: _containers.RepeatedScalarFieldContainer[float]
    fd_error_at_worst: float
    fd_refined: int
    fd_undecidable: _containers.RepeatedScalarFieldContainer[int]
    status: str
    explained_by: str
    failed_by: str
    fd_checked_by: str
    source_names: _containers.RepeatedCompositeFieldContainer[_graph_pb2.SourceName]
    fd_unconfirmed: _containers.RepeatedScalarFieldContainer[int]
    claim: str
    vs_engine: ClaimVsEngine
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., fd_mode: _Optional[str] = ..., gradient: _Optional[_Iterable[float]] = ..., reference: _Optional[_Iterable[float]] = ..., max_abs_error: _Optional[float] = ..., max_rel_error: _Optional[float] = ..., worst_index: _Optional[_Iterable[int]] = ..., engine_at_worst: _Optional[float] = ..., reference_at_worst: _Optional[float] = ..., tolerance: _Optional[_Union[Tolerance, _Mapping]] = ..., passed: _Optional[bool] = ..., gradient_norm: _Optional[float] = ..., fd_evaluations: _Optional[int] = ..., truncated: _Optional[bool] = ..., engine_projection: _Optional[_Iterable[float]] = ..., symbolic: _Optional[_Union[SymbolicComparison, _Mapping]] = ..., fd_vs_symbolic: _Optional[_Union[FdVsSymbolic, _Mapping]] = ..., fd_passed: _Optional[bool] = ..., verdict_reference: _Optional[str] = ..., fd_error: _Optional[_Iterable[float]] = ..., fd_error_at_worst: _Optional[float] = ..., fd_refined: _Optional[int] = ..., fd_undecidable: _Optional[_Iterable[int]] = ..., status: _Optional[str] = ..., explained_by: _Optional[str] = ..., failed_by: _Optional[str] = ..., fd_checked_by: _Optional[str] = ..., source_names: _Optional[_Iterable[_Union[_graph_pb2.SourceName, _Mapping]]] = ..., fd_unconfirmed: _Optional[_Iterable[int]] = ..., claim: _Optional[str] = ..., vs_engine: _Optional[_Union[ClaimVsEngine, _Mapping]] = ...) -> None: ...

class ClaimVsEngine(_message.Message):
    __slots__ = ("max_abs_error", "worst_index", "claimed_at_worst", "engine_at_worst", "agree")
    MAX_ABS_ERROR_FIELD_NUMBER: _ClassVar[int]
    WORST_INDEX_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_AT_WORST_FIELD_NUMBER: _ClassVar[int]
    ENGINE_AT_WORST_FIELD_NUMBER: _ClassVar[int]
    AGREE_FIELD_NUMBER: _ClassVar[int]
    max_abs_error: float
    worst_index: _containers.RepeatedScalarFieldContainer[int]
    claimed_at_worst: float
    engine_at_worst: float
    agree: bool
    def __init__(self, max_abs_error: _Optional[float] = ..., worst_index: _Optional[_Iterable[int]] = ..., claimed_at_worst: _Optional[float] = ..., engine_at_worst: _Optional[float] = ..., agree: _Optional[bool] = ...) -> None: ...

class FaultRecord(_message.Message):
    __slots__ = ("fault", "read_by", "before", "after")
    FAULT_FIELD_NUMBER: _ClassVar[int]
    READ_BY_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    fault: str
    read_by: _containers.RepeatedScalarFieldContainer[str]
    before: float
    after: float
    def __init__(self, fault: _Optional[str] = ..., read_by: _Optional[_Iterable[str]] = ..., before: _Optional[float] = ..., after: _Optional[float] = ...) -> None: ...

class WorstElement(_message.Message):
    __slots__ = ("index", "engine", "reference")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    index: _containers.RepeatedScalarFieldContainer[int]
    engine: float
    reference: float
    def __init__(self, index: _Optional[_Iterable[int]] = ..., engine: _Optional[float] = ..., reference: _Optional[float] = ...) -> None: ...

class Finding(_message.Message):
    __slots__ = ("node", "op", "cause", "severity", "parameters", "detail", "worst_element")
    NODE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    WORST_ELEMENT_FIELD_NUMBER: _ClassVar[int]
    node: str
    op: str
    cause: str
    severity: str
    parameters: _containers.RepeatedScalarFieldContainer[str]
    detail: str
    worst_element: WorstElement
    def __init__(self, node: _Optional[str] = ..., op: _Optional[str] = ..., cause: _Optional[str] = ..., severity: _Optional[str] = ..., parameters: _Optional[_Iterable[str]] = ..., detail: _Optional[str] = ..., worst_element: _Optional[_Union[WorstElement, _Mapping]] = ...) -> None: ...

class Memory(_message.Message):
    __slots__ = ("parameters_bytes", "gradients_bytes", "activations_peak_bytes", "live_peak_bytes", "inference_peak_bytes", "op_evaluations", "memory_source", "checkpoint", "checkpoint_profile", "checkpoint_segments", "checkpoint_kept_values", "checkpoint_activations_peak_bytes", "checkpoint_live_peak_bytes", "checkpoint_op_evaluations", "checkpoint_gradients_equal", "data_bytes", "optimizer", "optimizer_dtype", "optimizer_bytes", "peak_step", "peak_activations_bytes", "peak_gradients_bytes", "peak_transient_bytes", "training_peak_bytes", "inference_transient_bytes", "checkpoint_training_peak_bytes", "activations_by_node", "checkpoint_budget_bytes", "checkpoint_predicted_activations_peak_bytes", "checkpoint_kept")
    PARAMETERS_BYTES_FIELD_NUMBER: _ClassVar[int]
    GRADIENTS_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACTIVATIONS_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    LIVE_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    OP_EVALUATIONS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PROFILE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_KEPT_VALUES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ACTIVATIONS_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_LIVE_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_OP_EVALUATIONS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_GRADIENTS_EQUAL_FIELD_NUMBER: _ClassVar[int]
    DATA_BYTES_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_DTYPE_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_BYTES_FIELD_NUMBER: _ClassVar[int]
    PEAK_STEP_FIELD_NUMBER: _ClassVar[int]
    PEAK_ACTIVATIONS_BYTES_FIELD_NUMBER: _ClassVar[int]
    PEAK_GRADIENTS_BYTES_FIELD_NUMBER: _ClassVar[int]
    PEAK_TRANSIENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    TRAINING_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_TRANSIENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_TRAINING_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACTIVATIONS_BY_NODE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PREDICTED_ACTIVATIONS_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_KEPT_FIELD_NUMBER: _ClassVar[int]
    parameters_bytes: int
    gradients_bytes: int
    activations_peak_bytes: int
    live_peak_bytes: int
    inference_peak_bytes: int
    op_evaluations: int
    memory_source: str
    checkpoint: str
    checkpoint_profile: str
    checkpoint_segments: int
    checkpoint_kept_values: int
    checkpoint_activations_peak_bytes: int
    checkpoint_live_peak_bytes: int
    checkpoint_op_evaluations: int
    checkpoint_gradients_equal: bool
    data_bytes: int
    optimizer: str
    optimizer_dtype: str
    optimizer_bytes: int
    peak_step: str
    peak_activations_bytes: int
    peak_gradients_bytes: int
    peak_transient_bytes: int
    training_peak_bytes: int
    inference_transient_bytes: int
    checkpoint_training_peak_bytes: int
    activations_by_node: _containers.RepeatedCompositeFieldContainer[NodeMemory]
    checkpoint_budget_bytes: int
    checkpoint_predicted_activations_peak_bytes: int
    checkpoint_kept: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, parameters_bytes: _Optional[int] = ..., gradients_bytes: _Optional[int] = ..., activations_peak_bytes: _Optional[int] = ..., live_peak_bytes: _Optional[int] = ..., inference_peak_bytes: _Optional[int] = ..., op_evaluations: _Optional[int] = ..., memory_source: _Optional[str] = ..., checkpoint: _Optional[str] = ..., checkpoint_profile: _Optional[str] = ..., checkpoint_segments: _Optional[int] = ..., checkpoint_kept_values: _Optional[int] = ..., checkpoint_activations_peak_bytes: _Optional[int] = ..., checkpoint_live_peak_bytes: _Optional[int] = ..., checkpoint_op_evaluations: _Optional[int] = ..., checkpoint_gradients_equal: _Optional[bool] = ..., data_bytes: _Optional[int] = ..., optimizer: _Optional[str] = ..., optimizer_dtype: _Optional[str] = ..., optimizer_bytes: _Optional[int] = ..., peak_step: _Optional[str] = ..., peak_activations_bytes: _Optional[int] = ..., peak_gradients_bytes: _Optional[int] = ..., peak_transient_bytes: _Optional[int] = ..., training_peak_bytes: _Optional[int] = ..., inference_transient_bytes: _Optional[int] = ..., checkpoint_training_peak_bytes: _Optional[int] = ..., activations_by_node: _Optional[_Iterable[_Union[NodeMemory, _Mapping]]] = ..., checkpoint_budget_bytes: _Optional[int] = ..., checkpoint_predicted_activations_peak_bytes: _Optional[int] = ..., checkpoint_kept: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeMemory(_message.Message):
    __slots__ = ("node", "op", "bytes")
    NODE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    node: str
    op: str
    bytes: int
    def __init__(self, node: _Optional[str] = ..., op: _Optional[str] = ..., bytes: _Optional[int] = ...) -> None: ...

class MemoryTimeline(_message.Message):
    __slots__ = ("run", "steps", "live_bytes", "peak_bytes")
    RUN_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    LIVE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    run: str
    steps: _containers.RepeatedScalarFieldContainer[str]
    live_bytes: _containers.RepeatedScalarFieldContainer[int]
    peak_bytes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, run: _Optional[str] = ..., steps: _Optional[_Iterable[str]] = ..., live_bytes: _Optional[_Iterable[int]] = ..., peak_bytes: _Optional[_Iterable[int]] = ...) -> None: ...

class AttributesUsed(_message.Message):
    __slots__ = ("op", "used", "defaulted", "nodes")
    OP_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    DEFAULTED_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    op: str
    used: _struct_pb2.Struct
    defaulted: _containers.RepeatedScalarFieldContainer[str]
    nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, op: _Optional[str] = ..., used: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., defaulted: _Optional[_Iterable[str]] = ..., nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class Report(_message.Message):
    __slots__ = ("graph", "verdict", "loss", "dtype", "device", "parameters", "faults", "warnings", "memory", "timings", "findings", "symbolic", "custom_ops", "memory_timelines", "subject", "attributes", "fd_plan", "text")
    class TimingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    FAULTS_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    SYMBOLIC_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_OPS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TIMELINES_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    FD_PLAN_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    graph: str
    verdict: str
    loss: float
    dtype: str
    device: str
    parameters: _containers.RepeatedCompositeFieldContainer[ParameterResult]
    faults: _containers.RepeatedCompositeFieldContainer[FaultRecord]
    warnings: _containers.RepeatedScalarFieldContainer[str]
    memory: Memory
    timings: _containers.ScalarMap[str, float]
    findings: _containers.RepeatedCompositeFieldContainer[Finding]
    symbolic: SymbolicSummary
    custom_ops: _containers.RepeatedCompositeFieldContainer[CustomOp]
    memory_timelines: _containers.RepeatedCompositeFieldContainer[MemoryTimeline]
    subject: str
    attributes: _containers.RepeatedCompositeFieldContainer[AttributesUsed]
    fd_plan: FDPlan
    text: str
    def __init__(self, graph: _Optional[str] = ..., verdict: _Optional[str] = ..., loss: _Optional[float] = ..., dtype: _Optional[str] = ..., device: _Optional[str] = ..., parameters: _Optional[_Iterable[_Union[ParameterResult, _Mapping]]] = ..., faults: _Optional[_Iterable[_Union[FaultRecord, _Mapping]]] = ..., warnings: _Optional[_Iterable[str]] = ..., memory: _Optional[_Union[Memory, _Mapping]] = ..., timings: _Optional[_Mapping[str, float]] = ..., findings: _Optional[_Iterable[_Union[Finding, _Mapping]]] = ..., symbolic: _Optional[_Union[SymbolicSummary, _Mapping]] = ..., custom_ops: _Optional[_Iterable[_Union[CustomOp, _Mapping]]] = ..., memory_timelines: _Optional[_Iterable[_Union[MemoryTimeline, _Mapping]]] = ..., subject: _Optional[str] = ..., attributes: _Optional[_Iterable[_Union[AttributesUsed, _Mapping]]] = ..., fd_plan: _Optional[_Union[FDPlan, _Mapping]] = ..., text: _Optional[str] = ...) -> None: ...

class ListOpsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AttributeInfo(_message.Message):
    __slots__ = ("kind", "default", "required", "choices")
    KIND_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    kind: str
    default: _struct_pb2.Value
    required: bool
    choices: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, kind: _Optional[str] = ..., default: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., required: _Optional[bool] = ..., choices: _Optional[_Iterable[str]] = ...) -> None: ...

class KinkInfo(_message.Message):
    __slots__ = ("where", "convention")
    WHERE_FIELD_NUMBER: _ClassVar[int]
    CONVENTION_FIELD_NUMBER: _ClassVar[int]
    where: str
    convention: str
    def __init__(self, where: _Optional[str] = ..., convention: _Optional[str] = ...) -> None: ...

class OpInfo(_message.Message):
    __slots__ = ("name", "arity", "variadic", "inputs", "attributes", "formula", "kinks", "doc")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AttributeInfo
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AttributeInfo, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARITY_FIELD_NUMBER: _ClassVar[int]
    VARIADIC_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    FORMULA_FIELD_NUMBER: _ClassVar[int]
    KINKS_FIELD_NUMBER: _ClassVar[int]
    DOC_FIELD_NUMBER: _ClassVar[int]
    name: str
    arity: int
    variadic: bool
    inputs: _containers.RepeatedScalarFieldContainer[str]
    attributes: _containers.MessageMap[str, AttributeInfo]
    formula: str
    kinks: _containers.RepeatedCompositeFieldContainer[KinkInfo]
    doc: str
    def __init__(self, name: _Optional[str] = ..., arity: _Optional[int] = ..., variadic: _Optional[bool] = ..., inputs: _Optional[_Iterable[str]] = ..., attributes: _Optional[_Mapping[str, AttributeInfo]] = ..., formula: _Optional[str] = ..., kinks: _Optional[_Iterable[_Union[KinkInfo, _Mapping]]] = ..., doc: _Optional[str] = ...) -> None: ...

class ListOpsResponse(_message.Message):
    __slots__ = ("opset_version", "ops")
    OPSET_VERSION_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    opset_version: int
    ops: _containers.RepeatedCompositeFieldContainer[OpInfo]
    def __init__(self, opset_version: _Optional[int] = ..., ops: _Optional[_Iterable[_Union[OpInfo, _Mapping]]] = ...) -> None: ...

class GetServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Limits(_message.Message):
    __slots__ = ("max_message_bytes", "max_nodes", "max_elements", "max_symbolic_budget", "max_request_seconds", "max_queue", "max_name_length", "max_attribute_values", "max_formula_chars", "max_formula_depth", "max_symbolic_partials", "max_directions", "max_faults")
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_NODES_FIELD_NUMBER: _ClassVar[int]
    MAX_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    MAX_SYMBOLIC_BUDGET_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUEST_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_FIELD_NUMBER: _ClassVar[int]
    MAX_NAME_LENGTH_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTRIBUTE_VALUES_FIELD_NUMBER: _ClassVar[int]
    MAX_FORMULA_CHARS_FIELD_NUMBER: _ClassVar[int]
    MAX_FORMULA_DEPTH_FIELD_NUMBER: _ClassVar[int]
    MAX_SYMBOLIC_PARTIALS_FIELD_NUMBER: _ClassVar[int]
    MAX_DIRECTIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_FAULTS_FIELD_NUMBER: _ClassVar[int]
    max_message_bytes: int
    max_nodes: int
    max_elements: int
    max_symbolic_budget: int
    max_request_seconds: float
    max_queue: int
    max_name_length: int
    max_attribute_values: int
    max_formula_chars: int
    max_formula_depth: int
    max_symbolic_partials: int
    max_directions: int
    max_faults: int
    def __init__(self, max_message_bytes: _Optional[int] = ..., max_nodes: _Optional[int] = ..., max_elements: _Optional[int] = ..., max_symbolic_budget: _Optional[int] = ..., max_request_seconds: _Optional[float] = ..., max_queue: _Optional[int] = ..., max_name_length: _Optional[int] = ..., max_attribute_values: _Optional[int] = ..., max_formula_chars: _Optional[int] = ..., max_formula_depth: _Optional[int] = ..., max_symbolic_partials: _Optional[int] = ..., max_directions: _Optional[int] = ..., max_faults: _Optional[int] = ...) -> None: ...

class BackendInfo(_message.Message):
    __slots__ = ("name", "device", "available")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    device: str
    available: bool
    def __init__(self, name: _Optional[str] = ..., device: _Optional[str] = ..., available: _Optional[bool] = ...) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ("version", "opset_version", "backends", "devices", "oracles", "limits", "workers", "auth_required", "code_version")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OPSET_VERSION_FIELD_NUMBER: _ClassVar[int]
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    ORACLES_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    AUTH_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    CODE_VERSION_FIELD_NUMBER: _ClassVar[int]
    version: str
    opset_version: int
    backends: _containers.RepeatedCompositeFieldContainer[BackendInfo]
    devices: _containers.RepeatedScalarFieldContainer[str]
    oracles: _containers.RepeatedScalarFieldContainer[str]
    limits: Limits
    workers: int
    auth_required: bool
    code_version: str
    def __init__(self, version: _Optional[str] = ..., opset_version: _Optional[int] = ..., backends: _Optional[_Iterable[_Union[BackendInfo, _Mapping]]] = ..., devices: _Optional[_Iterable[str]] = ..., oracles: _Optional[_Iterable[str]] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., workers: _Optional[int] = ..., auth_required: _Optional[bool] = ..., code_version: _Optional[str] = ...) -> None: ...
