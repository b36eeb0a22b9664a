"""Compile the CUDA C the project emits the way CuPy compiles it, on a machine without a GPU.

The compiler: NVRTC (what CuPy calls), through ctypes from the first libnvrtc found (where CuPy's
cuda-pathfinder finds it, the loader's path, $CUDA_PATH or /usr/local/cuda, the nvidia-cuda-nvrtc
wheel); else `nvcc --ptx` for the same architecture (development and CI machines have nvcc).
The headers: CuPy's own (cupy/_core/include, found without importing CuPy) where CuPy is
installed, with the CCCL it bundles; else a stand-in for the three names CuPy's wrapper around
an ElementwiseKernel body uses (CArray, CIndexer, CUPY_FOR), nothing more -- so a body that needs
anything else from CuPy's headers fails here too.

Not CuPy's own compiler: cupy.cuda.compiler asks the CUDA driver even to compile
(cudaErrorInsufficientDriver without one), and CuPy with NVRTC is ~130 MB of wheels, ~340 MB
installed, for every development and CI machine.

The wrapper is CuPy's own (cupy/_core/_kernel.pyx, _get_elementwise_kernel_code): `typedef <type>
T;`, an `extern "C" __global__` function of `const CArray<...> _raw_in0, ..., CArray<...> _raw_y,
CIndexer<...> _ind` whose CUPY_FOR loop binds `const T &in0 = _raw_in0[_ind.get()]; ... T &y = ...`
and then runs the body; where CuPy is installed, test_cuda_kernels.py holds it to CuPy's own code
generation, token for token. Many kernels share one translation unit (one compiler start), each in a
namespace of its own so that each has its own T.
"""
from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

ARCH = "90"  # the GPU machine's H200; any architecture compiles the same C++
CTYPES = {"float32": "float", "float64": "double"}  # CuPy's type names (cupy/_core/_scalar.pyx)

STAND_IN = """
// stand-in for cupy/carray.cuh: what an ElementwiseKernel's wrapper uses, and nothing else
template <typename T, int ndim, bool c_contiguous = false, bool use_32bit_indexing = false>
class CArray {
  T* data_;
 public:
  __device__ T& operator[](long long i) const { return data_[i]; }
};
template <int ndim, bool use_32bit_indexing = false>
class CIndexer {
  long long size_, index_;
 public:
  __device__ long long size() const { return size_; }
  __device__ void set(long long i) { index_ = i; }
  __device__ long long get() const { return index_; }
};
#define CUPY_FOR(i, n) for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); \\
                            i += (long long)blockDim.x * gridDim.x)
"""
CUPY_HEADERS = ("cupy/complex.cuh", "cupy/carray.cuh", "cupy/atomics.cuh", "cupy/math_constants.h")


class CompileFailed(AssertionError):
    pass


def cuda_root() -> Path | None:
    for p in (os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if p and Path(p, "include").is_dir():
            return Path(p)
    nvcc = shutil.which("nvcc")
    return Path(nvcc).resolve().parent.parent if nvcc else None


def cupy_include() -> Path | None:
    """CuPy's kernel headers, where CuPy is installed (found without importing it)."""
    spec = importlib.util.find_spec("cupy")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations)), "_core", "include")
    return path if (path / "cupy" / "carray.cuh").is_file() else None


def _nvrtc_candidates():
    try:  # where CuPy itself finds it (cuda-pathfinder, installed with CuPy 14)
        from cuda.pathfinder import load_nvidia_dynamic_lib

        yield load_nvidia_dynamic_lib("nvrtc").abs_path
    except Exception:  # not installed, or it finds none
        pass
    yield from ("libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12")  # the loader's own search path
    root = cuda_root()
    if root:
        yield from sorted(glob.glob(str(root / "lib64" / "libnvrtc.so*")))
    spec = importlib.util.find_spec("nvidia")  # the nvidia-cuda-nvrtc wheel (CuPy's [ctk] extra)
    for base in (spec.submodule_search_locations or []) if spec else []:
        yield from sorted(glob.glob(os.path.join(base, "*", "lib", "libnvrtc.so*")))


def _nvrtc():
    for name in _nvrtc_candidates():
        try:
            return ctypes.CDLL(name), name
        except OSError:
            continue
    return None, None


def compiler() -> str | None:
    """'nvrtc (PATH)' or 'nvcc (PATH)' -- what compile_ptx will use -- or None: no CUDA compiler here."""
    lib, name = _nvrtc()
    if lib is not None:
        return f"nvrtc ({name})"
    root = cuda_root()
    nvcc = shutil.which("nvcc") or (str(root / "bin" / "nvcc") if root and (root / "bin" / "nvcc").is_file() else None)
    return f"nvcc ({nvcc})" if nvcc else None


def _include_dirs(headers: Path | None) -> list[str]:
    """CuPy's headers and the CCCL it bundles (thrust, cub, libcudacxx: complex.cuh needs thrust), then CUDA's."""
    root = cuda_root()
    cccl = [headers / "cupy" / "_cccl" / d for d in ("libcudacxx", "thrust", "cub")] if headers else []
    return [str(d) for d in [headers, *cccl, root / "include" if root else None] if d and d.is_dir()]


def compile_ptx(source: str, headers: Path | None) -> tuple[str, str]:
    """Compile one translation unit: (PTX, the compiler's log: warnings, empty when clean);
    CompileFailed with the log and the source lines it names on any error."""
    lib, _ = _nvrtc()
    options = [f"--gpu-architecture=compute_{ARCH}", "--std=c++17"] + [f"-I{d}" for d in _include_dirs(headers)]
    if lib is not None:
        return _nvrtc_compile(lib, source, options)
    nvcc = compiler().split(" (", 1)[1][:-1]
    with tempfile.TemporaryDirectory() as tmp:
        cu = Path(tmp, "kernels.cu")
        cu.write_text(source)
        run = subprocess.run([nvcc, "--ptx", f"-arch=sm_{ARCH}", "-std=c++17", *options[2:], "-o",
                              str(cu.with_suffix(".ptx")), str(cu)], capture_output=True, text=True, timeout=600)
        log = (run.stdout + run.stderr).strip()
        if run.returncode != 0:
            raise CompileFailed(_explained(log, source))
        return cu.with_suffix(".ptx").read_text(), log


def _nvrtc_compile(lib, source: str, options: list[str]) -> str:
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernels.cu", 0, None, None) != 0:
        raise CompileFailed("nvrtcCreateProgram failed")
    try:
        opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        rc = lib.nvrtcCompileProgram(prog, len(options), opts)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace").strip()
        if rc != 0:
            raise CompileFailed(_explained(log, source))
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetPTX(prog, ptx)
        return ptx.value.decode(), log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _explained(log: str, source: str) -> str:
    """The log, then each source line it names (kernels.cu(LINE) or kernels.cu:LINE), with the kernel's label."""
    lines = source.splitlines()
    named = sorted({int(n) for n in re.findall(r"kernels\.cu[(:](\d+)", log)})[:20]
    shown = []
    for n in named:
        label = next((t for t in reversed(lines[:n]) if t.startswith("// kernel ")), "")
        shown.append(f"{label}\n  line {n}: {lines[n - 1].strip() if n <= len(lines) else ''}")
    return "\n".join([log[:4000], *shown])


def elementwise_unit(kernels, headers: Path | None) -> str:
    """One translation unit of ElementwiseKernels, each wrapped as CuPy wraps it: `kernels` is a list of
    (label, ElementwiseSource, dtype name) with inputs and output of that dtype, contiguous, 1-d (the
    shape CuPy's reduce_dims gives contiguous arrays), 32-bit indexing."""
    prelude = "".join(f"#include <{h}>\n" for h in CUPY_HEADERS) if headers else STAND_IN
    return prelude + "".join(f"\n// kernel {k}: {label.replace(chr(10), ' ')} ({dtype})\nnamespace kernel{k} {{\n"
                             + cupy_kernel_code(src, dtype, f"{src.name}_{k}") + "}\n"
                             for k, (label, src, dtype) in enumerate(kernels))


def cupy_kernel_code(src, dtype: str, name: str | None = None) -> str:
    """The translation unit CuPy generates for one ElementwiseKernel (less its headers), as
    cupy/_core/_kernel.pyx's _get_elementwise_kernel_code writes it (test_cuda_kernels.py compares
    the two where CuPy is installed)."""
    ins = [p.split()[-1] for p in src.in_params.split(",")] if src.in_params.strip() else []
    outs = [p.split()[-1] for p in src.out_params.split(",")]
    arr = "CArray<{}, 1, 1, 1>".format(CTYPES[dtype])  # CuPy 14's four parameters (later ones add a defaulted fifth)
    params = [f"const {arr} _raw_{n}" for n in ins] + [f"{arr} _raw_{n}" for n in outs] + ["CIndexer<1, 1> _ind"]
    binds = [f"const T &{n} = _raw_{n}[_ind.get()];" for n in ins] + [f"T &{n} = _raw_{n}[_ind.get()];" for n in outs]
    body = "\n    ".join(binds + [src.operation])
    return (f"typedef {CTYPES[dtype]} T;\n"
            f"extern \"C\" __global__ void {name or src.name}({', '.join(params)}) {{\n  ;\n  #pragma unroll 1\n"
            f"  CUPY_FOR(i, _ind.size()) {{\n    _ind.set(i);\n    {body};\n  }}\n  ;\n}}\n")
