"""The autodiff engine: compile a Graph, run forward (saving through the
SavedStore), run backward. Backend-generic: the array module comes in."""
from .executor import Tape, backward, fit, forward, forward_batched, prepare_feeds
from .faults import Fault, inject, parse_fault
from .program import Program, Step

__all__ = ["Fault", "Program", "Step", "Tape", "backward", "fit", "forward", "forward_batched",
           "inject", "parse_fault", "prepare_feeds"]
