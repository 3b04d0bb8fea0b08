"""What this host's CPU offers TensorFlow, and the one process setting keras-preact picks for it.

TensorFlow switches its oneDNN CPU kernels on by itself only on CPUs with AVX512-VNNI,
AVX512-BF16, AVX-VNNI or AMX (`DefaultOneDnnPolicy` in tensorflow/core/util/util.cc). On
AVX2-only x86 CPUs it leaves them off, and its own kernels then train these nets several
times slower (figures in benchmarks/README.md, "oneDNN on AVX2-only CPUs"). TensorFlow reads
the switch, `TF_ENABLE_ONEDNN_OPTS`, once, when it loads: `use_onednn()` must run before
`import tensorflow`. The `keras-preact` CLI, the benchmarks, the notebooks and the test suite
call it first; a script of your own can do the same, or set the variable itself.

Example:
>>> from keras_preact import host
>>> env = {"TF_ENABLE_ONEDNN_OPTS": "0"}   # a value the user set is never replaced
>>> host.use_onednn(env)
False
>>> env
{'TF_ENABLE_ONEDNN_OPTS': '0'}
"""

from __future__ import annotations

import os
import platform
import warnings
from collections.abc import MutableMapping

ONEDNN = "TF_ENABLE_ONEDNN_OPTS"
# The /proc/cpuinfo flags for which TensorFlow turns oneDNN on by itself on Linux.
_ONEDNN_BY_DEFAULT = {"avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8",
                      "amx_bf16"}
# The flags of the CPUs that compute bfloat16 natively.
_BFLOAT16 = {"avx512_bf16", "amx_bf16"}


# The vector extensions a record names, as /proc/cpuinfo spells them.
_ISA = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_bf16": "AVX512-BF16", "amx_bf16": "AMX"}


def _cpuinfo(key: str) -> str | None:
    """The first value of `key` in Linux's /proc/cpuinfo; None elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() == key:
                    return value.strip()
    except OSError:
        pass
    return None


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags as Linux lists them in /proc/cpuinfo; None elsewhere."""
    flags = _cpuinfo("flags")
    return None if flags is None else set(flags.split())


def describe() -> str:
    """This machine in one line, for the records of a training run: CPU model, cores, memory,
    vector extensions and whether TensorFlow runs oneDNN, e.g. "AMD EPYC, 2 cores, 24 GB,
    AVX2, oneDNN on"."""
    try:
        memory = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GB"
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows) or no such name
        memory = ""
    flags = cpu_flags()
    isa = "" if flags is None else "".join(f", {v}" for k, v in _ISA.items() if k in flags)
    model = _cpuinfo("model name") or platform.processor() or platform.machine()
    onednn = "" if not _x86_linux() else f", oneDNN {'off' if onednn_off() else 'on'}"
    return f"{model}, {os.cpu_count()} cores{memory}{isa}{onednn}"


def _x86_linux() -> bool:
    return platform.system() == "Linux" and platform.machine().lower() in ("x86_64", "amd64")


def use_onednn(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Sets `TF_ENABLE_ONEDNN_OPTS=1` on x86-64 Linux unless `environ` already has a value;
    returns whether it set it. Only a TensorFlow imported afterwards sees it."""
    if ONEDNN in environ or not _x86_linux():
        return False
    environ[ONEDNN] = "1"
    return True


def onednn_off() -> bool:
    """True where TensorFlow runs (or, not yet imported, will run) without oneDNN on an
    x86-64 Linux CPU: the variable says 0, or is unset on a CPU outside TensorFlow's own
    list."""
    if not _x86_linux():
        return False
    value = os.environ.get(ONEDNN, "").strip().lower()
    if value in ("0", "false", "1", "true"):
        return value in ("0", "false")
    flags = cpu_flags()  # unset (or not a boolean, which TensorFlow ignores): its own policy
    return flags is not None and not flags & _ONEDNN_BY_DEFAULT


def cpu_has_bfloat16() -> bool | None:
    """Whether the CPU computes bfloat16 natively (AVX512-BF16 or AMX-BF16); None where its
    flags cannot be read (not Linux)."""
    flags = cpu_flags()
    return None if flags is None else bool(flags & _BFLOAT16)


def warn_slow_cpu_settings(mixed_precision: str) -> None:
    """One warning for each setting that makes a CPU-only run far slower than it need be
    (figures in benchmarks/README.md, "Precision" and "oneDNN on AVX2-only CPUs")."""
    if onednn_off():
        warnings.warn(f"TensorFlow runs without its oneDNN kernels on this CPU, several times "
                      f"slower: set {ONEDNN}=1 before TensorFlow is imported (the "
                      f"keras-preact CLI does).", stacklevel=3)
    if mixed_precision == "float16":
        warnings.warn("float16 has no fast kernels on CPUs and runs far slower than float32: "
                      "use --mixed-precision bfloat16 (CPUs with AMX or AVX512-BF16) or off.",
                      stacklevel=3)
    if mixed_precision == "bfloat16" and cpu_has_bfloat16() is False:
        warnings.warn("this CPU has no bfloat16 instructions (AVX512-BF16 or AMX), so bfloat16 "
                      "runs far slower than float32 here: use --mixed-precision off.",
                      stacklevel=3)
