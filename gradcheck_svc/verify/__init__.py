"""Run the engine and the oracles, compare, and build the Report."""
from .compare import Tolerance, compare
from .report import ParameterResult, Report
from .run import VerifyOptions, run_engine, verify

__all__ = ["ParameterResult", "Report", "Tolerance", "VerifyOptions", "compare", "run_engine", "verify"]
