"""The user's own module, run in float64 for the check: no copy (issue 42, item 2).

A copy (copy.deepcopy, then .to(float64)) drops what the user registered on the module's tensors: a hook
on a parameter (`weight.register_hook(lambda g: g * 1.5)`) is lost with the Parameter object, so the check
would verify a gradient the user's training never sees. Instead each floating Parameter keeps its
identity -- its hooks, its name in an optimizer -- and only its data is swapped for a float64 copy while
the check runs (`p.data = ...`, as nn.Module.to does), its .grad set aside; floating buffers are swapped
likewise. Everything is put back afterwards, whatever happens: the user's data, dtypes and .grad are as
they were, and the check's own gradients and any buffer updates (a BatchNorm's running statistics in
train mode) land on the copies.
"""
from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def in_float64(fn):
    """While the block runs, fn (an nn.Module; anything else is left alone) holds float64 copies of its floating
    parameters' data and buffers, its parameters' .grad cleared; yields the names of those upcast."""
    if not isinstance(fn, torch.nn.Module):
        yield []
        return
    upcast = [n for n, t in [*fn.named_parameters(), *fn.named_buffers()]
              if t.is_floating_point() and t.dtype != torch.float64]
    params = [(p, p.data, p.grad) for p in fn.parameters()]
    buffers = [(m, name, b) for m in fn.modules() for name, b in m._buffers.items() if b is not None]
    try:
        with torch.no_grad():
            for p, data, _ in params:
                p.grad = None
                if data.is_floating_point():
                    p.data = data.to(torch.float64, copy=True)
            for m, name, b in buffers:
                if b.is_floating_point():
                    m._buffers[name] = b.to(torch.float64, copy=True)
        yield upcast
    finally:
        for p, data, grad in params:
            p.data = data
            p.grad = grad
        for m, name, b in buffers:
            m._buffers[name] = b
