"""Reference gradients the engine is checked against.

ORACLES names the oracles (GetServerInfo reports them); the other modules here
are their parts: local_jacobian, mp_eval and sympy_arrays serve the symbolic one.
"""
ORACLES = ("finite_diff", "symbolic")
