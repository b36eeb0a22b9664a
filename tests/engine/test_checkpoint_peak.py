"""Checkpointing inside a verification lowers the process's memory peak: under a policy the
un-checkpointed gradient run is never made (its figures come from a metering forward that
keeps nothing it saves), measured here with tracemalloc, which sees NumPy's buffers."""
import tracemalloc

import numpy as np

from gradcheck_svc.verify import VerifyOptions
from gradcheck_svc.verify.engine_run import run_engine
from graphs_memory import chain


def engine_peak(graph, policy):
    tracemalloc.start()
    try:
        run = run_engine(graph, VerifyOptions(checkpoint=policy), "float64")
        return tracemalloc.get_traced_memory()[1], run
    finally:
        tracemalloc.stop()


def test_process_peak_drops_with_the_policy_and_the_profile_stays_exact():
    graph = chain(256, width=8, batch=256)  # 256 layers of 256x8 float64 activations: they dominate
    run_engine(graph, VerifyOptions(checkpoint="sqrt"), "float64")  # first-use allocations out of the way
    peak_none, none = engine_peak(graph, "none")
    peak_sqrt, sqrt = engine_peak(graph, "sqrt")
    acts = none.memory["activations_peak_bytes"]
    assert acts > 20 * none.memory["parameters_bytes"]  # activations dominate the plain run
    assert peak_none > acts  # the plain run held them all
    assert peak_sqrt < peak_none / 2.5, (peak_none, peak_sqrt)  # the sqrt run never does
    # the metering forward reproduces the un-checkpointed activation figure exactly
    assert sqrt.memory["activations_peak_bytes"] == acts
    assert sqrt.memory["op_evaluations"] == none.memory["op_evaluations"]
    assert sqrt.memory["checkpoint_activations_peak_bytes"] < acts / 5
    # gradients equal without a plain run to compare with: bit for bit, as claimed
    assert sqrt.memory["checkpoint_gradients_equal"] is True
    for p in none.gradients:
        assert np.array_equal(none.gradients[p], sqrt.gradients[p])


def test_an_effective_fault_under_a_policy_makes_the_gradients_unequal():
    from gradcheck_svc.engine import parse_fault

    graph = chain(16, width=4, batch=2)
    last = graph.nodes[-2].name  # in the final segment: saved in the first forward, read by backward
    run = run_engine(graph, VerifyOptions(checkpoint="sqrt", faults=(parse_fault(f"{last}:scale:2"),)), "float64")
    assert run.faults[0].readers
    assert run.memory["checkpoint_gradients_equal"] is False
