"""Run the engine and the oracles, compare, and build the Report."""
from .compare import Tolerance, compare
from .engine_run import run_engine
from .options import VerifyOptions
from .report import ParameterResult, Report
from .run import verify

__all__ = ["ParameterResult", "Report", "Tolerance", "VerifyOptions", "compare", "run_engine", "verify"]
