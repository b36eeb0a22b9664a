"""The autodiff engine: compile a Graph, run forward (saving through the
SavedStore), run backward. Backend-generic: the array module comes in."""
from .checkpoint import Plan, Policy, parse_policy
from .checkpoint import plan as checkpoint_plan
from .executor import (HELD, Tape, backward, fit, forward, forward_batched, frozen_step, prepare_feeds, selection_of,
                       selections)
from .faults import Fault, inject, parse_fault
from .program import Program, Step

__all__ = ["Fault", "Plan", "Policy", "Program", "Step", "Tape", "backward", "fit", "forward", "forward_batched",
           "inject", "checkpoint_plan", "parse_fault", "parse_policy", "prepare_feeds"]
