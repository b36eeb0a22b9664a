"""Graph loading: bytes or JSON -> validated Graph (decode.py, validate.py)."""
from .decode import load_graph, parse_graph
from .ir import Graph, GraphInput, Node
from .validate import Limits, validate

__all__ = ["Graph", "GraphInput", "Limits", "Node", "load_graph", "parse_graph", "validate"]
