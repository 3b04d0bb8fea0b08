"""keras_preact.host: the oneDNN switch keras-preact's entry points set before TensorFlow loads,
and the CPU facts the trainer's warnings rest on."""

import os
import platform
import subprocess
import sys

import pytest

from keras_preact import host


@pytest.mark.parametrize("system, machine, before, after", [
    ("Linux", "x86_64", None, "1"),      # TensorFlow would decide by CPU flags: we say on
    ("Linux", "x86_64", "0", "0"),       # the user's value is kept
    ("Linux", "x86_64", "true", "true"),
    ("Linux", "aarch64", None, None),    # ARM: TensorFlow's own policy
    ("Darwin", "x86_64", None, None),
    ("Windows", "AMD64", None, None),    # TensorFlow turns it on there itself
])
def test_use_onednn(system, machine, before, after, monkeypatch):
    monkeypatch.setattr(platform, "system", lambda: system)
    monkeypatch.setattr(platform, "machine", lambda: machine)
    env = {} if before is None else {host.ONEDNN: before}
    assert host.use_onednn(env) is (before is None and after is not None)
    assert env.get(host.ONEDNN) == after


@pytest.mark.parametrize("value, flags, off", [
    ("0", {"avx2", "avx512_vnni"}, True),
    ("false", {"avx2"}, True),
    ("1", {"avx2"}, False),
    (None, {"avx2", "fma"}, True),             # TensorFlow's own policy leaves it off
    (None, {"avx2", "avx512f", "avx512_vnni"}, False),
    (None, {"avx2", "amx_tile"}, False),
    ("maybe", {"avx2"}, True),                 # not a boolean: TensorFlow's policy applies
    (None, None, False),                       # flags unknown: no claim
])
def test_onednn_off(value, flags, off, monkeypatch):
    monkeypatch.setattr(host, "_x86_linux", lambda: True)
    monkeypatch.setattr(host, "cpu_flags", lambda: flags)
    if value is None:
        monkeypatch.delenv(host.ONEDNN, raising=False)
    else:
        monkeypatch.setenv(host.ONEDNN, value)
    assert host.onednn_off() is off


def test_onednn_off_is_never_claimed_off_x86_linux(monkeypatch):
    monkeypatch.setattr(host, "_x86_linux", lambda: False)
    monkeypatch.setenv(host.ONEDNN, "0")
    assert host.onednn_off() is False


@pytest.mark.parametrize("flags, has", [({"avx512_bf16"}, True), ({"amx_bf16"}, True),
                                        ({"avx2", "avx512f"}, False), (None, None)])
def test_cpu_has_bfloat16(flags, has, monkeypatch):
    monkeypatch.setattr(host, "cpu_flags", lambda: flags)
    assert host.cpu_has_bfloat16() is has


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="Linux only")
def test_cpu_flags_reads_this_cpu():
    flags = host.cpu_flags()
    assert flags and all(f == f.lower() and " " not in f for f in flags)
    if platform.machine() == "x86_64":
        assert "sse2" in flags  # every x86-64 CPU has it


@pytest.mark.skipif(not (platform.system() == "Linux" and platform.machine() == "x86_64"),
                    reason="x86-64 Linux only")
@pytest.mark.parametrize("user_value, enabled", [(None, True), ("0", False)])
def test_the_cli_loads_tensorflow_with_onednn_on_unless_told_otherwise(user_value, enabled):
    """TensorFlow's own answer, whatever this CPU would have got by default."""
    env = {k: v for k, v in os.environ.items() if k != host.ONEDNN}
    if user_value is not None:
        env[host.ONEDNN] = user_value
    code = ("from keras_preact import cli; cli.import_tensorflow(); "
            "from tensorflow.python.util import _pywrap_util_port as p; print(p.IsMklEnabled())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.stdout.strip() == str(enabled), done.stderr[-2000:]
