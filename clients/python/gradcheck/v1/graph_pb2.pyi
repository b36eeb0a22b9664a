from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data", "raw")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: _containers.RepeatedScalarFieldContainer[float]
    raw: bytes
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[_Iterable[float]] = ..., raw: _Optional[bytes] = ...) -> None: ...

class Input(_message.Message):
    __slots__ = ("name", "value", "requires_grad", "source_names")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    REQUIRES_GRAD_FIELD_NUMBER: _ClassVar[int]
    SOURCE_NAMES_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: Tensor
    requires_grad: bool
    source_names: _containers.RepeatedCompositeFieldContainer[SourceName]
    def __init__(self, name: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ..., requires_grad: _Optional[bool] = ..., source_names: _Optional[_Iterable[_Union[SourceName, _Mapping]]] = ...) -> None: ...

class SourceName(_message.Message):
    __slots__ = ("name", "relation", "onnx_name", "read_by")
    NAME_FIELD_NUMBER: _ClassVar[int]
    RELATION_FIELD_NUMBER: _ClassVar[int]
    ONNX_NAME_FIELD_NUMBER: _ClassVar[int]
    READ_BY_FIELD_NUMBER: _ClassVar[int]
    name: str
    relation: str
    onnx_name: str
    read_by: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., relation: _Optional[str] = ..., onnx_name: _Optional[str] = ..., read_by: _Optional[_Iterable[str]] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("name", "op", "inputs", "attrs", "inplace")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    INPLACE_FIELD_NUMBER: _ClassVar[int]
    name: str
    op: str
    inputs: _containers.RepeatedScalarFieldContainer[str]
    attrs: _struct_pb2.Struct
    inplace: bool
    def __init__(self, name: _Optional[str] = ..., op: _Optional[str] = ..., inputs: _Optional[_Iterable[str]] = ..., attrs: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., inplace: _Optional[bool] = ...) -> None: ...

class Graph(_message.Message):
    __slots__ = ("opset_version", "name", "inputs", "nodes", "output", "claimed", "notes")
    OPSET_VERSION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    opset_version: int
    name: str
    inputs: _containers.RepeatedCompositeFieldContainer[Input]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    output: str
    claimed: Claims
    notes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, opset_version: _Optional[int] = ..., name: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[Input, _Mapping]]] = ..., nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., output: _Optional[str] = ..., claimed: _Optional[_Union[Claims, _Mapping]] = ..., notes: _Optional[_Iterable[str]] = ...) -> None: ...

class Claims(_message.Message):
    __slots__ = ("gradients", "adjoints")
    class GradientsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    class AdjointsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    GRADIENTS_FIELD_NUMBER: _ClassVar[int]
    ADJOINTS_FIELD_NUMBER: _ClassVar[int]
    gradients: _containers.MessageMap[str, Tensor]
    adjoints: _containers.MessageMap[str, Tensor]
    def __init__(self, gradients: _Optional[_Mapping[str, Tensor]] = ..., adjoints: _Optional[_Mapping[str, Tensor]] = ...) -> None: ...
