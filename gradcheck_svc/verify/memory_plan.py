"""`gradcheck-svc plan-memory`: a training step's memory, planned without running it.

One metering forward of the plain gradient run (engine/executor.py, metering=True): it counts
every tensor the backward would need, buffer by buffer, without keeping them, so the process holds
about an inference's memory, never a training step's; no backward runs. Or, with shapes_only (and
automatically when that forward's live peak, counted from shapes first, is over `max_run_bytes`),
the same count from shapes alone (engine/shape_meter.py): nothing is computed or allocated beyond
the graph's inputs. From either:

- exact: the activation bytes (and by node), the forward's live peak, the data, the parameters, the
  gradients (one buffer per parameter, its shape and dtype), the optimizer's state;
- with --budget: the checkpoint plan of engine/budget.py (chains and DAGs), its kept values, predicted
  activation peak and recomputed steps -- the same plan `verify --checkpoint budget:BYTES` runs;
- `formula_training_bytes`: the textbook sum data + parameters + gradients + optimizer +
  activations. It is not the measured live peak of `verify` (which splits that peak at the instant
  it is reached, transients included, docs/memory.md): activations and gradients are rarely all
  held at once, and transients are not in it.
"""
from __future__ import annotations

import os

import numpy as np

from ..backend import get_backend
from ..engine import budget as budget_plan
from ..engine import forward, prepare_feeds
from ..engine.program import program_of
from ..engine.shape_meter import shape_forward
from ..errors import OptionError
from ..text import graph_label
from .memory_profile import TOP_NODES, _unit, distinct_bytes, distinct_elements, optimizer_state_bytes
from .options import DTYPES


def default_max_run_bytes() -> int:
    """A quarter of this machine's physical memory (the metering forward's live peak above it: plan
    from shapes)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (ValueError, OSError, AttributeError):
        return 1 << 30


def plan_memory(graph, *, dtype: str | None = None, optimizer: str = "none", optimizer_dtype: str | None = None,
                budget: int | None = None, shapes_only: bool = False, max_run_bytes: int | None = None) -> dict:
    dtype = dtype or graph.declared_float_dtype
    if dtype not in DTYPES:
        raise OptionError(f"unknown dtype '{dtype}' (expected {' or '.join(DTYPES)})", field="dtype")
    opt_dtype = optimizer_dtype or dtype
    optimizer_state_bytes(optimizer, opt_dtype, 0)  # its errors before the forward
    program = program_of(graph, DTYPES[dtype])
    if program.inplace_root:
        raise OptionError("planning a graph with in-place nodes is not supported", field="graph")
    tape = shape_forward(program)  # cheap: decides whether the metering forward may run
    limit = default_max_run_bytes() if max_run_bytes is None else max_run_bytes
    from_shapes = shapes_only or tape.live.peak > limit
    if from_shapes:
        params_bytes = sum(tape.input_bytes[p] for p in program.params)
        elements = sum(tape.input_elements[p] for p in program.params)
        data_bytes = sum(tape.input_bytes.values()) - params_bytes
    else:
        backend = get_backend("cpu")
        feeds = prepare_feeds(program, backend)
        tape = forward(program, backend, feeds, grad=True, metering=True)
        params = [feeds[p] for p in program.params]
        params_bytes = distinct_bytes(params)
        elements = distinct_elements(params)
        data_bytes = distinct_bytes(feeds.values()) - params_bytes
    grads_bytes = elements * np.dtype(DTYPES[dtype]).itemsize
    ops = {s.name: s.op.name for s in program.steps}
    by_node = sorted(tape.store.saved_by_node().items(), key=lambda kv: -kv[1])
    plan = {
        "graph": graph.name,
        "dtype": dtype,
        "steps": len(program.steps),
        "planned_from": "shapes" if from_shapes else "metering forward",
        "data_bytes": data_bytes,
        "parameters_bytes": params_bytes,
        "parameter_elements": elements,
        "gradients_bytes": grads_bytes,
        "optimizer": optimizer,
        "optimizer_dtype": opt_dtype,
        "optimizer_bytes": optimizer_state_bytes(optimizer, opt_dtype, elements),
        "activations_peak_bytes": int(tape.store.saved.peak),
        "forward_live_peak_bytes": int(tape.live.peak),
        "activations_by_node": [{"node": n, "op": ops[n], "bytes": int(b)} for n, b in by_node],
    }
    plan["formula_training_bytes"] = (plan["data_bytes"] + params_bytes + grads_bytes + plan["optimizer_bytes"]
                                      + plan["activations_peak_bytes"])
    if budget is not None:
        chosen = budget_plan.plan_for_budget(program, tape, budget)
        plan.update({
            "budget_bytes": budget,
            "checkpoint": f"budget:{budget}",
            "checkpoint_kept": chosen.kept,
            "checkpoint_segments": len(chosen.ends),
            "checkpoint_predicted_activations_peak_bytes": chosen.predicted_peak,
            "checkpoint_recomputed_steps": chosen.recomputed_steps,
            "checkpoint_budget_method": chosen.method,
            "checkpoint_formula_training_bytes": plan["formula_training_bytes"] - plan["activations_peak_bytes"]
            + chosen.predicted_peak,
        })
    return plan


def plan_text(p: dict) -> str:
    scale, unit = _unit(p["formula_training_bytes"])
    f = lambda n: f"{n / scale:.3g}" if scale > 1 else str(int(n))  # noqa: E731
    how = "from shapes, nothing run" if p["planned_from"] == "shapes" else "one metering forward, no backward"
    lines = [f"{graph_label(p['graph'])}: memory plan ({p['dtype']}, {p['steps']} steps; {how})",
             f"  training (formula) {f(p['formula_training_bytes'])} {unit} = data {f(p['data_bytes'])} + params "
             f"{f(p['parameters_bytes'])} + grads {f(p['gradients_bytes'])} + optimizer {f(p['optimizer_bytes'])} "
             f"({p['optimizer']}, {p['optimizer_dtype']}) + activations {f(p['activations_peak_bytes'])}; "
             f"forward live peak {f(p['forward_live_peak_bytes'])} {unit}"]
    nodes = p["activations_by_node"]
    if nodes:
        top = ", ".join(f"{d['node']} ({d['op']}) {f(d['bytes'])}" for d in nodes[:TOP_NODES])
        more = f" of {len(nodes)}" if len(nodes) > TOP_NODES else ""
        lines.append(f"  activations by node (top {min(TOP_NODES, len(nodes))}{more}, {unit}): {top}")
    if "budget_bytes" in p:
        kept = ", ".join(p["checkpoint_kept"][:8]) + (" ..." if len(p["checkpoint_kept"]) > 8 else "")
        lines.append(f"  budget {f(p['budget_bytes'])} {unit}: {p['checkpoint_segments']} segments, keeps "
                     f"{kept or 'nothing'}; activations {f(p['checkpoint_predicted_activations_peak_bytes'])} {unit} "
                     f"(predicted), {p['checkpoint_recomputed_steps']} steps recomputed "
                     f"({p['checkpoint_budget_method']}); training (formula) "
                     f"{f(p['checkpoint_formula_training_bytes'])} {unit}")
    return "\n".join(lines)
