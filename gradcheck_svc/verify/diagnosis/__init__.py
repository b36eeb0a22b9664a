"""Diagnosis: turn the engine's records and the oracles' disagreements into findings.

One module per analysis, each importing only what is below it:
    context.py    the typed inputs every analysis reads (Context), value helpers
    rules.py      one op's vjp evaluated in isolation at given values
    integrity.py  saved-tensor fingerprints and in-place writes
    nonfinite.py  the first node making NaN/Inf
    localize.py   the first node whose gradient goes wrong (finite differences)
    classify.py   why that node is wrong: kink, wrong rule, rounding, corrupted read
    diagnose.py   the order they run in, and the verdict

This file imports nothing, so a submodule never imports the package back.
"""
