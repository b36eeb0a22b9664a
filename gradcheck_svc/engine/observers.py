"""Observers of the backward loop (executor.backward): what happens beside the chain rule.

The loop calls an observer at four points -- the loss's adjoint made (`seeded`), an input's adjoint
set or accumulated (`accumulated`), a step done, its adjoint no longer the loop's (`stepped`), the
parameters' gradients returned (`finished`) -- and does nothing else but the chain rule.

`MemoryAccounting` is the live-memory accounting the memory profile reads (the meter's peak, its
parts and timeline; memory.py): each adjoint is held while the loop holds it, a parameter's counted
as a gradient. `AdjointRecorder` also keeps every adjoint and each vjp's contribution, for fault
localization (backward(keep_adjoints=True)).
"""
from __future__ import annotations


class MemoryAccounting:
    """The bytes the backward pass holds, on the tape's meter: an adjoint is held from when it is set to
    when its step has used it; a parameter's gradient is counted as one (live.grads).

    An adjoint passed through as an input's (add's g) is held once more and dropped once at its step's end:
    the same count as a hand-over, and no bytes move (a second hold of a held buffer only counts a reference)."""

    def __init__(self, tape):
        live = tape.live
        self.hold, self.drop, self.hold_grad, self.drop_grad = live.hold, live.drop, live.hold_grad, live.drop_grad
        self.mark = live.mark if live.marks else None
        self.params = tape.program.param_set

    def seeded(self, g) -> None:
        self.hold(g)

    def accumulated(self, step, k: int, name: str, gi, prev, acc) -> None:
        """acc is name's adjoint now: gi (its first contribution) or prev + gi; prev is dropped."""
        if name in self.params:
            self.hold_grad(acc)
            if prev is not None:
                self.drop_grad(prev)
        else:
            self.hold(acc)
            if prev is not None:
                self.drop(prev)

    def stepped(self, step, g) -> None:
        """After the step's vjp and the release of its saved tensors (g: its adjoint, None when none flowed)."""
        if g is not None:
            self.drop(g)
        if self.mark is not None:
            self.mark("backward", step.name)

    def finished(self, grads: dict) -> None:
        pass


class AdjointRecorder(MemoryAccounting):
    """The accounting, and every value's dL/dv (tape.adjoints) and each vjp's contribution to each input
    (tape.contributions, keyed (step name, input index))."""

    def __init__(self, tape):
        super().__init__(tape)
        self.adjoints, self.contributions = tape.adjoints, tape.contributions

    def accumulated(self, step, k: int, name: str, gi, prev, acc) -> None:
        self.contributions[(step.name, k)] = gi
        super().accumulated(step, k, name, gi, prev, acc)

    def stepped(self, step, g) -> None:
        if g is not None:
            self.adjoints[step.name] = g
        super().stepped(step, g)

    def finished(self, grads: dict) -> None:
        self.adjoints.update(grads)
