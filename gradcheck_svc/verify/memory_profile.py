"""The memory profile of a verification: measured figures and their one-screen summary.

Every figure is read from a run, not estimated from shapes: on NumPy the
bytes of the distinct buffers the engine holds (engine/memory.py), on CuPy
the live figures come from the memory pool's used bytes. The JSON keys:

  parameters_bytes        buffers of the parameters (inputs with requires_grad)
  gradients_bytes         buffers of the gradients the backward pass returns
  activations_peak_bytes  peak of the tensors kept for backward (saved tensors,
                          and checkpoint values), graph inputs not counted
  live_peak_bytes         peak of every array the gradient run holds
  inference_peak_bytes    peak of every array a no-grad forward holds
  op_evaluations          forward op evaluations of the gradient run
  memory_source           "engine_arrays" (NumPy) or "cupy_pool" (CuPy live figures)
  checkpoint              the policy the reported gradients were computed under
  checkpoint_profile      the policy the checkpoint_* figures describe: the one in
                          force, or sqrt as a what-if when none is
  checkpoint_segments, checkpoint_kept_values, checkpoint_activations_peak_bytes,
  checkpoint_live_peak_bytes, checkpoint_op_evaluations,
  checkpoint_gradients_equal  gradients bit for bit those without checkpointing

The first six describe the run without checkpointing. Without a policy that run is the
reported one. Under a policy it is never made (holding every activation is what the
policy avoids): a metering forward counts what it would hold without keeping it, so
activations_peak_bytes is exact (a plain run's saved tensors all live until its
backward begins) and live_peak_bytes is its forward's peak (counted bytes, also on
CuPy); checkpoint_gradients_equal is then "every recomputed value matched the first
forward's fingerprint and no fault was read", which makes the backward, the same code
over the same values, give the un-checkpointed gradients bit for bit.
"""
from __future__ import annotations

from ..engine.memory import MemoryMeter
from .plot import Series, line_plot


def distinct_bytes(arrays) -> int:
    """Bytes of the distinct buffers behind some arrays (views counted once)."""
    meter = MemoryMeter()
    for a in arrays:
        meter.hold(a)
    return meter.current


def profile(params: list, plain, plain_grads: dict, inference, *, policy: str = "none", sampled: bool = False,
            checkpointed=None, profile_plan=None, gradients_equal: bool | None = None) -> dict:
    """params: the parameters' device arrays; plain / inference / checkpointed: tapes after their
    runs (gradient run without checkpointing, no-grad forward, gradient run under profile_plan);
    plain_grads: the device gradients of the plain run."""
    memory = {
        "parameters_bytes": distinct_bytes(params),
        "gradients_bytes": distinct_bytes(plain_grads.values()),
        "activations_peak_bytes": int(plain.store.saved.peak),
        "live_peak_bytes": int(plain.live.measured_peak),
        "inference_peak_bytes": int(inference.live.measured_peak),
        "op_evaluations": int(plain.op_evaluations),
        "memory_source": "cupy_pool" if sampled else "engine_arrays",
        "checkpoint": policy,
    }
    if checkpointed is not None:
        memory.update({
            "checkpoint_profile": str(profile_plan.policy),
            "checkpoint_segments": len(profile_plan.segments),
            "checkpoint_kept_values": len(profile_plan.kept),
            "checkpoint_activations_peak_bytes": int(checkpointed.store.saved.peak),
            "checkpoint_live_peak_bytes": int(checkpointed.live.measured_peak),
            "checkpoint_op_evaluations": int(checkpointed.op_evaluations),
            "checkpoint_gradients_equal": bool(gradients_equal),
        })
    return memory


# --- the one-screen summary ---------------------------------------------------------------


def _unit(n: float) -> tuple[float, str]:
    for scale, name in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if n >= scale:
            return scale, name
    return 1.0, "B"


def summary(m: dict) -> list[str]:
    """e.g. 'training 41.2 MB = params 4.1 + grads 4.1 + activations 33.0; inference 4.9 MB;
    sqrt checkpointing: activations 6.3 MB for 1.98x the forward work'."""
    if "parameters_bytes" not in m:
        return []
    params, grads, acts = m["parameters_bytes"], m["gradients_bytes"], m["activations_peak_bytes"]
    total = params + grads + acts
    scale, unit = _unit(total)
    f = lambda n: f"{n / scale:.3g}" if scale > 1 else str(int(n))  # noqa: E731
    lines = [f"memory: training {f(total)} {unit} = params {f(params)} + grads {f(grads)} + activations "
             f"{f(acts)}; inference {f(m['inference_peak_bytes'])} {unit}; live peak "
             f"{f(m['live_peak_bytes'])} {unit} ({m['op_evaluations']} op evaluations, "
             f"measured: {m.get('memory_source', 'engine_arrays')})"]
    if "checkpoint_profile" in m:
        work = m["checkpoint_op_evaluations"] / max(1, m["op_evaluations"])
        in_force = m.get("checkpoint", "none") != "none"
        verb = "" if in_force else " would need"
        same = ("; gradients identical to none" if m["checkpoint_gradients_equal"]
                else "; gradients DIFFER from none") if in_force else ""
        lines.append(f"  {m['checkpoint_profile']} checkpointing{verb}: activations "
                     f"{f(m['checkpoint_activations_peak_bytes'])} {unit} for {work:.2f}x the forward work "
                     f"({m['checkpoint_segments']} segments, {m['checkpoint_kept_values']} values kept, live "
                     f"peak {f(m['checkpoint_live_peak_bytes'])} {unit}){same}")
    return lines


# --- the timeline plot --------------------------------------------------------------------


def write_timeline_plot(path, timelines: dict, graph_name: str = "") -> None:
    """Live bytes after each step of forward, recompute and backward, one line per run;
    a dotted vertical marks where each run's backward pass begins."""
    series = []
    for label, events in timelines.items():
        ys = [b for _, b in events]
        start = next((i for i, (what, _) in enumerate(events) if not what.startswith("forward ")), None)
        name = {"none": "no checkpointing", "inference": "inference (no grad)"}.get(label, f"{label} checkpointing")
        series.append(Series(name, list(range(len(ys))), ys, marks=[] if start is None else [start],
                             dashed=label == "inference"))
    line_plot(path, series, title=f"live memory per step{': ' + graph_name if graph_name else ''} "
                                  "(forward, then backward from the dotted line)",
              xlabel="step (forward, recompute and backward steps, in order)", ylabel="live bytes")
