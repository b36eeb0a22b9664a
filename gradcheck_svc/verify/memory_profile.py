"""The memory profile of a verification: measured figures and their one-screen summary.

One accounting (docs/memory.md). Every figure is read from a run's meter
(engine/memory.py), not estimated from shapes: on NumPy the bytes of the
distinct buffers the engine holds, on CuPy the live figures come from the
memory pool's used bytes. Each run's live peak is the maximum over its
timeline (the most bytes held during each step), and at that instant the
bytes held split exactly into

  data + parameters + activations (saved for backward) + gradients (the
  parameters') + transients (everything else: adjoints in flight, a step's
  output before its inputs are released)

A training step needs that peak plus the optimizer's state, which lives
across steps (SGD none, momentum one buffer per parameter, Adam/AdamW two,
in the optimizer's dtype): training_peak_bytes = live_peak_bytes +
optimizer_bytes. Inference is the same split without activations and
gradients, so it can never exceed training. The JSON keys:

  data_bytes              graph inputs that are not parameters
  parameters_bytes        buffers of the parameters (inputs with requires_grad)
  gradients_bytes         buffers of the gradients the backward pass returns
  optimizer, optimizer_dtype, optimizer_bytes   the optimizer's state
  activations_peak_bytes  peak of the tensors kept for backward (saved tensors,
                          and checkpoint values), graph inputs not counted
  live_peak_bytes         peak of every array the gradient run holds
  peak_step               the step during which it was reached
  peak_activations_bytes, peak_gradients_bytes, peak_transient_bytes
                          its parts (with data_bytes and parameters_bytes)
  training_peak_bytes     live_peak_bytes + optimizer_bytes
  inference_peak_bytes    peak of every array a no-grad forward holds
  inference_transient_bytes  its part beyond data and parameters
  activations_by_node     [{node, op, bytes}], largest first: the activation
                          bytes of the run without checkpointing, each buffer
                          attributed to the first node that saved it, as held
                          when backward begins (they sum to activations_peak_bytes
                          unless an in-place write swapped a saved buffer during
                          the forward)
  op_evaluations          forward op evaluations of the gradient run
  memory_source           "engine_arrays" (NumPy) or "cupy_pool" (CuPy live figures)
  checkpoint              the policy the reported gradients were computed under
  checkpoint_profile      the policy the checkpoint_* figures describe: the one in
                          force, or sqrt as a what-if when none is
  checkpoint_segments, checkpoint_kept_values, checkpoint_activations_peak_bytes,
  checkpoint_live_peak_bytes, checkpoint_training_peak_bytes, checkpoint_op_evaluations,
  checkpoint_gradients_equal  gradients bit for bit those without checkpointing
  checkpoint_budget_bytes, checkpoint_predicted_activations_peak_bytes, checkpoint_kept
                          under budget:BYTES: the budget, the plan's predicted activation
                          peak (to set beside checkpoint_activations_peak_bytes, measured)
                          and the values it keeps
  checkpoint_recomputed_steps, checkpoint_budget_method
                          ... the op evaluations it adds, and how it was chosen (chain DP,
                          or the DAG heuristic's pick: engine/budget.py)

The figures before `checkpoint` describe the run without checkpointing. Without a policy
that run is the reported one. Under a policy it is never made (holding every activation
is what the policy avoids): a metering forward counts what it would hold without keeping
it (activations_peak_bytes is exact: a plain run's saved tensors all live until its
backward begins), and its backward is replayed from the checkpointed run's (replay_backward:
the same adjoints, the plain run's saved tensors released node by node), so
live_peak_bytes covers the whole forward+backward. checkpoint_gradients_equal is then
"every recomputed value matched the first forward's fingerprint and no fault was read",
which makes the backward, the same code over the same values, give the un-checkpointed
gradients bit for bit.
"""
from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field

from ..engine.memory import MemoryMeter, Timeline
from ..errors import OptionError

# optimizer -> state buffers per parameter element (SGD without momentum keeps none)
OPTIMIZERS = {"none": 0, "sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}
OPTIMIZER_DTYPES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
TOP_NODES = 5  # activations_by_node rows in the text report


def optimizer_state_bytes(optimizer: str, dtype: str, elements: int) -> int:
    """Bytes of an optimizer's state for `elements` parameter elements."""
    if optimizer not in OPTIMIZERS:
        raise OptionError(f"unknown optimizer '{optimizer}' (expected {', '.join(OPTIMIZERS)})", field="optimizer")
    if dtype not in OPTIMIZER_DTYPES:
        raise OptionError(f"unknown optimizer dtype '{dtype}' (expected {', '.join(OPTIMIZER_DTYPES)})",
                          field="optimizer_dtype")
    return OPTIMIZERS[optimizer] * OPTIMIZER_DTYPES[dtype] * elements


def distinct_bytes(arrays) -> int:
    """Bytes of the distinct buffers behind some arrays (views counted once)."""
    meter = MemoryMeter()
    for a in arrays:
        meter.hold(a)
    return meter.current


def distinct_elements(arrays) -> int:
    seen = {}
    for a in arrays:
        o = a
        while getattr(o, "base", None) is not None and hasattr(o.base, "nbytes"):
            o = o.base
        seen[id(o)] = o
    return sum(int(o.size) for o in seen.values())


@dataclass
class RunMemory:
    """One run's live peak and its parts, read from its timeline."""

    peak: int
    activations: int  # saved for backward, at the peak
    gradients: int  # the parameters' gradients, at the peak
    step: str  # the step during which it was reached
    timeline: Timeline


def of_timeline(timeline: Timeline) -> RunMemory:
    """The maximum over the timeline (the first step reaching it) and its parts."""
    i = timeline.peak_index()
    if i is None:
        return RunMemory(0, 0, 0, "", timeline)
    best = timeline[i]
    return RunMemory(int(best.high), int(best.high_saved), int(best.high_grads), best.label, timeline)


def replay_backward(metering, checkpointed) -> Timeline:
    """The un-checkpointed run's timeline without making it: the metering forward's steps, then
    the checkpointed run's backward steps with its saved tensors (and kept values) swapped for
    those the plain run would hold -- everything the metering forward pinned, released as each
    node's backward step releases them. The adjoints are the same arrays in both runs, the
    graph inputs the same buffers, so the swap is exact (in counted bytes)."""
    pins = metering.store.pins
    sizes = metering.live.token_bytes
    refs = Counter(token for node_pins in pins.values() for token, _ in node_pins)
    saved = metering.live.saved.current  # every pinned activation: held until backward begins
    fwd = metering.live.timeline
    out = Timeline()
    out.kinds, out.names, out.numbers = bytearray(fwd.kinds), list(fwd.names), array("q", fwd.numbers)
    ck = checkpointed.live.timeline
    live, high, ck_saved, ck_high_saved, high_grads = ck.columns
    for i in range(len(ck)):
        if ck.kind(i) != "backward":
            continue  # recompute steps are the policy's, not the plain run's
        before = saved
        for token, _ in pins.get(ck.names[i], ()):
            refs[token] -= 1
            if refs[token] == 0:
                saved -= sizes[token]
        out.append("backward", ck.names[i], live[i] - ck_saved[i] + saved, high[i] - ck_high_saved[i] + before,
                   saved, before, high_grads[i])
    return out


@dataclass
class ProfileRuns:
    """The runs the memory profile reads (engine_run.run_engine makes them), each tape with its timeline
    recorded: the gradient run without checkpointing (a metering forward when `metered`), the no-grad
    forward's timeline, and the gradient run under profile_plan (`checkpointed`, when one was made)."""

    plain: object
    plain_grads: dict  # the device gradients of the plain run (or of the checkpointed one: the same sizes)
    inference: object  # the no-grad forward's Timeline (memory.py)
    policy: str = "none"  # the checkpoint policy asked for
    sampled: bool = False  # the live figures are the device pool's samples
    metered: bool = False
    checkpointed: object = None
    profile_plan: object = None
    gradients_equal: bool | None = None  # the checkpointed run's gradients bit for bit the plain run's
    budget_plan: object = None  # a budget policy's plan (engine/budget.py)


def profile(program, feeds: dict, runs: ProfileRuns, optimizer: str = "none", optimizer_dtype: str | None = None,
            dtype: str = "float64") -> tuple[dict, dict]:
    """program, feeds: the run's Program and device inputs; runs: the runs made for the profile; optimizer
    (and its state's dtype, default the engine's): its state joins the training figure. Returns (the memory
    figures, run label -> timeline)."""
    plain, checkpointed, profile_plan = runs.plain, runs.checkpointed, runs.profile_plan
    params_bytes, data_bytes, opt_dtype, opt_bytes = _held(program, feeds, optimizer, optimizer_dtype, dtype)
    none = of_timeline(replay_backward(plain, checkpointed) if runs.metered else plain.live.timeline)
    inf = of_timeline(runs.inference)
    by_node = sorted(plain.saved_by_node.items(), key=lambda kv: -kv[1])
    ops = {s.name: s.op.name for s in program.steps}
    memory = {
        "data_bytes": data_bytes,
        "parameters_bytes": params_bytes,
        "gradients_bytes": distinct_bytes(runs.plain_grads.values()),
        "optimizer": optimizer,
        "optimizer_dtype": opt_dtype,
        "optimizer_bytes": opt_bytes,
        "activations_peak_bytes": int(plain.store.saved.peak),
        "live_peak_bytes": none.peak,
        "peak_step": none.step,
        "peak_activations_bytes": none.activations,
        "peak_gradients_bytes": none.gradients,
        "peak_transient_bytes": none.peak - data_bytes - params_bytes - none.activations - none.gradients,
        "training_peak_bytes": none.peak + opt_bytes,
        "inference_peak_bytes": inf.peak,
        "inference_transient_bytes": inf.peak - data_bytes - params_bytes,
        "activations_by_node": [{"node": n, "op": ops.get(n, ""), "bytes": int(b)} for n, b in by_node],
        "op_evaluations": int(plain.op_evaluations),
        "memory_source": "cupy_pool" if runs.sampled else "engine_arrays",
        "checkpoint": runs.policy,
    }
    timelines = {"none": none.timeline, "inference": inf.timeline}
    if checkpointed is not None:
        ck = of_timeline(checkpointed.live.timeline)
        memory.update(_checkpoint_figures(ck, runs, opt_bytes))
        timelines[str(profile_plan.policy)] = ck.timeline
    return memory, timelines



def _held(program, feeds: dict, optimizer: str, optimizer_dtype: str | None, dtype: str) -> tuple:
    """(the parameters' bytes, the data's, the optimizer state's dtype and bytes)."""
    params = [feeds[p] for p in program.params]
    params_bytes = distinct_bytes(params)
    opt_dtype = optimizer_dtype or dtype
    return (params_bytes, distinct_bytes(feeds.values()) - params_bytes, opt_dtype,
            optimizer_state_bytes(optimizer, opt_dtype, distinct_elements(params)))


def checkpoint_figures(program, feeds: dict, runs: ProfileRuns, optimizer: str = "none",
                       optimizer_dtype: str | None = None, dtype: str = "float64") -> dict:
    """The figures profile() adds for runs.checkpointed, where that run was made apart from the others (a
    finite-difference split's shard: verify/engine_run.what_if_figures)."""
    opt_bytes = _held(program, feeds, optimizer, optimizer_dtype, dtype)[3]
    return _checkpoint_figures(of_timeline(runs.checkpointed.live.timeline), runs, opt_bytes)


def _checkpoint_figures(ck, runs: ProfileRuns, opt_bytes: int) -> dict:
    """The checkpointed run's figures: ck its timeline's summary; with a budget policy, the budget plan's
    prediction and choice too."""
    checkpointed, profile_plan, budget_plan = runs.checkpointed, runs.profile_plan, runs.budget_plan
    memory = {
        "checkpoint_profile": str(profile_plan.policy),
        "checkpoint_segments": len(profile_plan.segments),
        "checkpoint_kept_values": len(profile_plan.kept),
        "checkpoint_activations_peak_bytes": int(checkpointed.store.saved.peak),
        "checkpoint_live_peak_bytes": ck.peak,
        "checkpoint_training_peak_bytes": ck.peak + opt_bytes,
        "checkpoint_op_evaluations": int(checkpointed.op_evaluations),
        "checkpoint_gradients_equal": bool(runs.gradients_equal),
    }
    if budget_plan is not None:  # budget:BYTES (engine/budget.py): the plan's prediction and its choice
        memory.update({
            "checkpoint_budget_bytes": int(profile_plan.policy.k),
            "checkpoint_predicted_activations_peak_bytes": int(budget_plan.predicted_peak),
            "checkpoint_kept": list(budget_plan.kept),
            "checkpoint_recomputed_steps": int(budget_plan.recomputed_steps),
            "checkpoint_budget_method": budget_plan.method,
        })
    return memory

# --- the one-screen summary ---------------------------------------------------------------


def _unit(n: float) -> tuple[float, str]:
    for scale, name in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if n >= scale:
            return scale, name
    return 1.0, "B"


def summary(m: dict) -> list[str]:
    """The figures of `m` (the JSON's), e.g.
    'memory: training 96 B = data 8 + params 16 + grads 8 + optimizer 32 (adam, float64) + activations 16
       + transients 16, at its live peak (backward a); inference 40 B = data 8 + params 16 + transients 16'."""
    if "parameters_bytes" not in m:
        return []
    scale, unit = _unit(m["training_peak_bytes"])
    f = lambda n: f"{n / scale:.3g}" if scale > 1 else str(int(n))  # noqa: E731
    at = f" ({m['peak_step']})" if m.get("peak_step") else ""
    lines = [f"memory: training {f(m['training_peak_bytes'])} {unit} = data {f(m['data_bytes'])} + params "
             f"{f(m['parameters_bytes'])} + grads {f(m['peak_gradients_bytes'])} + optimizer "
             f"{f(m['optimizer_bytes'])} ({m['optimizer']}, {m['optimizer_dtype']}) + activations "
             f"{f(m['peak_activations_bytes'])} + transients {f(m['peak_transient_bytes'])}, at its live peak{at}; "
             f"inference {f(m['inference_peak_bytes'])} {unit} = data {f(m['data_bytes'])} + params "
             f"{f(m['parameters_bytes'])} + transients {f(m['inference_transient_bytes'])}",
             f"  live peak {f(m['live_peak_bytes'])} {unit}; activations peak {f(m['activations_peak_bytes'])} {unit}, "
             f"all gradients {f(m['gradients_bytes'])} {unit} ({m['op_evaluations']} op evaluations, measured: "
             f"{m.get('memory_source', 'engine_arrays')})"]
    if "checkpoint_profile" in m:
        work = m["checkpoint_op_evaluations"] / max(1, m["op_evaluations"])
        in_force = m.get("checkpoint", "none") != "none"
        verb = "" if in_force else " would need"
        same = ("; gradients identical to none" if m["checkpoint_gradients_equal"]
                else "; gradients DIFFER from none") if in_force else ""
        if "checkpoint_budget_bytes" in m:
            kept = ", ".join(m["checkpoint_kept"][:8]) + (" ..." if len(m["checkpoint_kept"]) > 8 else "")
            lines.append(f"  budget {f(m['checkpoint_budget_bytes'])} {unit}: predicted activations "
                         f"{f(m['checkpoint_predicted_activations_peak_bytes'])} {unit}, measured "
                         f"{f(m['checkpoint_activations_peak_bytes'])} {unit}; keeps {kept or 'nothing'}; "
                         f"{m['checkpoint_recomputed_steps']} steps recomputed ({m['checkpoint_budget_method']})")
        lines.append(f"  {m['checkpoint_profile']} checkpointing{verb}: activations "
                     f"{f(m['checkpoint_activations_peak_bytes'])} {unit} for {work:.2f}x the forward work "
                     f"({m['checkpoint_segments']} segments, {m['checkpoint_kept_values']} values kept, live "
                     f"peak {f(m['checkpoint_live_peak_bytes'])} {unit}, training "
                     f"{f(m['checkpoint_training_peak_bytes'])} {unit}){same}")
    nodes = m.get("activations_by_node") or []
    if nodes:
        top = ", ".join(f"{d['node']} ({d['op']}) {f(d['bytes'])}" for d in nodes[:TOP_NODES])
        more = f" of {len(nodes)}" if len(nodes) > TOP_NODES else ""
        lines.append(f"  activations by node (top {min(TOP_NODES, len(nodes))}{more}, {unit}): {top}")
    return lines


# --- the plot -----------------------------------------------------------------------------

RUN_NAMES = {"none": "no checkpointing", "inference": "inference (no grad)"}


def run_name(run: str) -> str:
    return RUN_NAMES.get(run, f"{run} checkpointing")


def run_peak(m: dict, run: str) -> int | None:
    """The live peak the report states for a timeline's run (the plot's and the page's legends)."""
    if run == "none":
        return m.get("live_peak_bytes")
    if run == "inference":
        return m.get("inference_peak_bytes")
    return m.get("checkpoint_live_peak_bytes") if run == m.get("checkpoint_profile") else None


def write_memory_plot(path, report: dict) -> None:
    """The most bytes held during each step of forward, recompute and backward, one line per run
    (the maximum of each line is the run's live peak in the report); a dotted vertical marks
    where each run's backward pass begins; the optimizer's state, when there is one, as a
    constant line (training = a gradient run's line + it). Below, the activation bytes per node.
    Drawn from the JSON report (`memory_timelines`, `memory`): both verify commands draw a report
    the same way, whether it was made here or came from a server."""
    from .plot import Bar, Series, line_plot  # the SVG writer (and its XML escapes): for a plot only

    memory, graph_name = report.get("memory") or {}, report.get("graph", "")
    series = []
    for t in report.get("memory_timelines") or []:
        run, ys = t.get("run", ""), list(t.get("peak_bytes") or [])  # each step's high
        start = next((i for i, step in enumerate(t.get("steps") or []) if not step.startswith("forward ")), None)
        peak = run_peak(memory, run)
        series.append(Series(f"{run_name(run)}: peak {peak} B" if peak is not None else run_name(run),
                             list(range(len(ys))), ys, marks=[] if start is None else [start],
                             dashed=run == "inference"))
    opt = memory.get("optimizer_bytes", 0)
    if opt and series:
        n = max(len(s.x) for s in series)
        series.append(Series(f"optimizer state ({memory['optimizer']}, {memory['optimizer_dtype']}): {opt} B; "
                             f"training peak {memory['training_peak_bytes']} B", [0, max(0, n - 1)], [opt, opt],
                             dashed=True))
    bars = [Bar(f"{d['node']} ({d['op']})", d["bytes"]) for d in memory.get("activations_by_node") or []]
    line_plot(path, series, title=f"live memory per step{': ' + graph_name if graph_name else ''} "
                                  "(forward, then backward from the dotted line)",
              xlabel="step (forward, recompute and backward steps, in order)",
              ylabel="most bytes held during the step", bars=bars,
              bars_title="activation bytes saved for backward, by node (no checkpointing)")
