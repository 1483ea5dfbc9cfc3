"""torch's process-wide settings, read before an implementation runs and restored after it.

Every case of a job runs in the same processes: the reference, the other implementations and
the later cases run under whatever settings an implementation leaves behind. One that turns on
flush-to-zero makes the CPU reference flush subnormals too, so a flushing kernel then passes
the cases made to catch it; a float64 default dtype changes the inputs ``make_inputs`` builds;
TF32, a reduced-precision reduction, autocast or another BLAS library changes the next
matmul's numbers; fewer intra-op threads, disabled flash attention or cuDNN benchmarking
changes the next implementation's time. The environment variables that NCCL and gloo read
when a later case makes a communicator count too: an ``NCCL_ALGO`` left behind changes the
next group's reduction order. So do torch's public functions: one replaced process-wide
computes every later reference with the replacement; a working directory left elsewhere takes
the next implementation's relative paths with it. ``changed`` names each setting that
differs from a ``snapshot`` and puts it back.

Each setting is read only where this torch has it (the names move between releases: the
``fp32_precision`` properties came in 2.9), and CUDA's only once CUDA is initialised, so
reading never initialises it.
"""

from __future__ import annotations

import ctypes
import functools
import os
import pwd
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy
import torch

#: settings that are plain attributes: (owner, attribute) under ``torch``
_ATTRIBUTES = (
    ("backends.cuda.matmul", "allow_tf32"),
    ("backends.cuda.matmul", "allow_fp16_reduced_precision_reduction"),
    ("backends.cuda.matmul", "allow_bf16_reduced_precision_reduction"),
    ("backends.cuda.matmul", "allow_fp16_accumulation"),
    ("backends.cuda.matmul", "fp32_precision"),
    ("backends.cudnn", "enabled"),
    ("backends.cudnn", "allow_tf32"),
    ("backends.cudnn", "deterministic"),
    ("backends.cudnn", "benchmark"),
    ("backends.cudnn", "fp32_precision"),
    ("backends.mkldnn", "enabled"),
    ("backends.mkldnn", "fp32_precision"),
    ("backends.mkldnn.matmul", "fp32_precision"),
    ("backends.mkldnn.conv", "fp32_precision"),
    ("backends.mkldnn.rnn", "fp32_precision"),
    ("backends.cudnn.conv", "fp32_precision"),
    ("backends.cudnn.rnn", "fp32_precision"),
    ("backends", "fp32_precision"),
    ("backends.opt_einsum", "enabled"),
    ("backends.opt_einsum", "strategy"),
)

#: settings behind a getter and a setter: (name, getter, setter) under ``torch``
_ACCESSORS = (
    ("grad mode", "is_grad_enabled", "set_grad_enabled"),
    ("float32 matmul precision", "get_float32_matmul_precision",
     "set_float32_matmul_precision"),
    ("intra-op threads", "get_num_threads", "set_num_threads"),
    ("flash attention", "backends.cuda.flash_sdp_enabled", "backends.cuda.enable_flash_sdp"),
    ("memory-efficient attention", "backends.cuda.mem_efficient_sdp_enabled",
     "backends.cuda.enable_mem_efficient_sdp"),
    ("math attention", "backends.cuda.math_sdp_enabled", "backends.cuda.enable_math_sdp"),
    ("cuDNN attention", "backends.cuda.cudnn_sdp_enabled", "backends.cuda.enable_cudnn_sdp"),
    ("transformer fast path", "backends.mha.get_fastpath_enabled",
     "backends.mha.set_fastpath_enabled"),
)


@dataclass(frozen=True)
class Setting:
    """One process-wide setting: its name, how to read it, how to put a value back."""

    name: str
    get: Callable[[], Any]
    put: Callable[[Any], None]
    #: each thread holds its own, and a thread inherits its creator's: a thread started
    #: while it was changed (an OpenMP or gloo worker) keeps it after it is put back here
    per_thread: bool = False
    #: how a change reads, from the value before and the value now
    describe: Callable[[Any, Any], str] | None = None

    def change(self, before: Any, now: Any) -> str:
        if self.describe is not None:
            return f"{self.name}: {self.describe(before, now)}"
        return f"{self.name}: {before} -> {now}"


#: environment variables read each time a communicator is made, which a later case may do:
#: NCCL's and torch's NCCL options (algorithm, protocol: the reduction order) and gloo's.
#: Not those read once per process, which a change after that first read no longer reaches
#: and which a library sets, by design, just before it: NVSHMEM's (before its one
#: nvshmem_init), cuBLAS's workspace (torch reads it once), NVIDIA_TF32_OVERRIDE,
#: OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES; nor those torch.compile sets for itself
#: (TORCHINDUCTOR_*, TRITON_CACHE_DIR)
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_")


@functools.cache
def _c_environ() -> Any:
    """The C library's ``environ``, which getenv reads: a library's own setenv changes it
    without Python's ``os.environ`` knowing. None where ctypes cannot find it."""
    try:
        return ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    except (OSError, ValueError, AttributeError):
        return None


def _conf_lines(path: str) -> list[tuple[str, str]]:
    try:
        with open(path, "rb") as file:
            lines = file.read().split(b"\n")
    except OSError:
        return []
    found = []
    for line in lines:
        if line.startswith(b"#") or b"=" not in line:
            continue
        key, _, value = line.partition(b"=")
        found.append((key[:1023].decode(errors="replace"), value[:1023].decode(errors="replace")))
    return found


@functools.cache
def nccl_conf() -> dict[str, str]:
    """What NCCL sets from its configuration files when it first reads a variable, each only
    where it is unset (NVIDIA/nccl src/misc/param.cc ``initEnvFunc``, read 2026-11: the file
    ``NCCL_CONF_FILE`` names, else ``~/.nccl.conf``, then ``/etc/nccl.conf``, each line
    ``NAME=value`` through ``setenv(name, value, 0)``, lines starting with ``#`` skipped). The
    first case to make a NCCL communicator does that: NCCL's doing, not the implementation's."""
    first = os.environ.get("NCCL_CONF_FILE")
    if not first:
        try:
            first = os.path.join(pwd.getpwuid(os.getuid()).pw_dir, ".nccl.conf")
        except KeyError:
            first = None
    conf: dict[str, str] = {}
    for path in (first, "/etc/nccl.conf"):
        for key, value in _conf_lines(path) if path else []:
            conf.setdefault(key, value)
    return conf


def _environment() -> tuple[tuple[str, str], ...]:
    """The watched variables, with what torch and NCCL would set themselves where they are
    unset (so that their doing so changes nothing): torch's ProcessGroupNCCL constructor sets
    ``NCCL_ALGO=^NVLS`` under deterministic algorithms (torch/csrc/distributed/c10d/
    ProcessGroupNCCL.cpp, read 2026-11), before NCCL's first read applies its files."""
    environ = _c_environ()
    if environ is None:
        items = [(k, v) for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)]
    else:
        prefixes = tuple(p.encode() for p in ENV_PREFIXES)
        items, i = [], 0
        while (entry := environ[i]) is not None:
            if entry.startswith(prefixes):
                key, _, value = entry.partition(b"=")
                items.append((key.decode(errors="replace"), value.decode(errors="replace")))
            i += 1
    every = {k: v for k, v in nccl_conf().items() if k.startswith(ENV_PREFIXES)}
    if torch.are_deterministic_algorithms_enabled():
        every["NCCL_ALGO"] = "^NVLS"
    every.update(items)  # what is set wins over both
    return tuple(sorted(every.items()))


def _put_environment(value: tuple[tuple[str, str], ...]) -> None:
    keep = dict(value)
    for key, _ in _environment():
        if key not in keep:
            os.environ.pop(key, None)
            os.unsetenv(key)  # set by setenv in C, os.environ never had it
    for key, now in keep.items():
        # NCCL's files' values too: what NCCL would set itself, once, where unset
        os.environ[key] = now  # putenv too


def _environment_change(before: tuple[tuple[str, str], ...],
                        now: tuple[tuple[str, str], ...]) -> str:
    was, now_ = dict(before), dict(now)
    return ", ".join(f"{k}: {was.get(k, '(unset)')} -> {now_.get(k, '(unset)')}"
                     for k in sorted(set(was) | set(now_)) if was.get(k) != now_.get(k))


#: whether a per-thread setting was found changed in this process (``tainted``)
_TAINTED = False


def _resolve(path: str) -> Any:
    obj: Any = torch
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _readable(get: Callable[[], Any]) -> bool:
    try:
        get()
    except Exception:  # a build without it (no cuDNN, no MKLDNN): nothing to guard
        return False
    return True


def _flushes_denormals() -> bool:
    # torch has no getter for set_flush_denormal (FTZ/DAZ of this thread's CPU): probe it
    probe = torch.tensor([2.0 ** -140], dtype=torch.float32, device="cpu")
    return probe.mul(1.0).item() == 0.0


def _default_device() -> torch.device:
    return torch.get_default_device()


def _put_default_device(device: torch.device) -> None:
    # None removes the mode set_default_device installs; "cpu" is what an unset one reads
    torch.set_default_device(None if device == torch.device("cpu") else device)


def _affinity() -> frozenset[int]:
    return frozenset(os.sched_getaffinity(0))  # AttributeError off Linux: not read there


def _put_affinity(cpus: frozenset[int]) -> None:
    os.sched_setaffinity(0, cpus)


def _deterministic() -> tuple[bool, bool]:
    return (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled())


def _put_deterministic(value: tuple[bool, bool]) -> None:
    torch.use_deterministic_algorithms(value[0], warn_only=value[1])


def _anomaly() -> tuple[bool, bool]:
    return torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()


def _put_anomaly(value: tuple[bool, bool]) -> None:
    torch.set_anomaly_enabled(value[0], value[1])


def _rng_bytes(get: Callable[[], torch.Tensor]) -> Callable[[], bytes]:
    """A generator's state (a uint8 tensor, torch's or CUDA's) as bytes, which compare."""
    return lambda: get().numpy().tobytes()


def _rng_put(put: Callable[[torch.Tensor], None]) -> Callable[[bytes], None]:
    return lambda state: put(torch.frombuffer(bytearray(state), dtype=torch.uint8))


def _numpy_rng() -> tuple:
    name, keys, pos, has_gauss, gauss = numpy.random.get_state()
    return name, keys.tobytes(), pos, has_gauss, gauss


def _put_numpy_rng(state: tuple) -> None:
    name, keys, pos, has_gauss, gauss = state
    numpy.random.set_state((name, numpy.frombuffer(keys, dtype=numpy.uint32), pos,
                            has_gauss, gauss))


def _rng_change(moved_by: str, own: str) -> Callable[[Any, Any], str]:
    # the states are kilobytes of generator words: what moves them is what a user acts on
    return lambda before, now: (f"reseeded or drawn from ({moved_by}): the calling program's "
                                f"random stream moves with every call; draw from {own} of "
                                "the implementation's own")


#: the namespaces whose public functions a reference calls: one replaced process-wide (a
#: monkeypatched ``F.silu``) would compute every later reference with it, the wrong kernel's
#: own arithmetic its judge. The Tensor class and its C base: a method patched onto the class
#: shadows the base's
_FUNCTION_OWNERS = ("", "nn.functional", "linalg", "special", "fft", "Tensor", "_C.TensorBase")


def _same_function(now: Any, before: Any) -> bool:
    """``now`` is ``before``, or a wrapper of it (``functools.wraps``: importing torch._dynamo
    wraps torch.manual_seed so, torch/_dynamo/__init__.py)."""
    for _ in range(8):
        if now is before:
            return True
        now = getattr(now, "__wrapped__", None)
        if now is None:
            return False
    return False


def _inherited(cls: type, name: str) -> Any:
    """What ``cls.name`` is without ``cls``'s own attribute: its bases' (a method put back
    with ``Tensor.amax = saved`` lands on the class itself, the same object)."""
    for base in cls.__mro__[1:]:
        if name in vars(base):
            return vars(base)[name]
    return None


class _Functions:
    """A copy of each namespace's own attributes; equal to an earlier copy when every public
    function that one holds is still the same object, or wraps it (names added since,
    torch's lazy attributes, do not count, but on a class, where they shadow its base's)."""

    def __init__(self) -> None:
        self.owners = [(o, _resolve(o) if o else torch) for o in _FUNCTION_OWNERS]
        self.names = [dict(vars(obj)) for _, obj in self.owners]

    def replaced(self, before: _Functions) -> list[tuple[str, str, Any]]:
        """(owner, name, the function before) for each public function not as it was."""
        found = []
        for (owner, obj), now, then in zip(self.owners, self.names, before.names, strict=True):
            if now == then:  # C-speed: identity first, as dict comparison goes
                continue
            for name, f in then.items():
                if (not name.startswith("_") and callable(f)
                        and not _same_function(now.get(name), f)):
                    found.append((owner, name, f))
            if isinstance(obj, type):
                found += [(owner, name, None) for name in now.keys() - then.keys()
                          if not name.startswith("_")
                          and not _same_function(now[name], _inherited(obj, name))]
        return found

    def __eq__(self, before: object) -> bool:
        return isinstance(before, _Functions) and not self.replaced(before)

    __hash__ = None  # type: ignore[assignment]


def _replaced(before: _Functions, now: _Functions) -> str:
    names = [f"torch.{owner + '.' if owner else ''}{name}"
             for owner, name, _ in now.replaced(before)]
    return ", ".join(names) + " replaced"


def _put_functions(before: _Functions) -> None:
    now = _Functions()
    owners = dict(now.owners)
    for owner, name, f in now.replaced(before):
        obj = owners[owner]
        if f is None:  # a method added to a class over its base's
            delattr(obj, name)
        else:
            setattr(obj, name, f)


#: a duplicate of each file that fd 1 or 2 was seen to be, by (device, inode): what puts the
#: stream back once an implementation closed or redirected it
_STREAM_FILES: dict[tuple[int, int], int] = {}


def _streams() -> tuple[tuple[int, int] | None, ...]:
    """The files fds 1 and 2 are (device, inode), None where closed. The ranks' output (a
    kernel's printf, the watchdog's stacks) goes through them to the launch log; a rank
    whose fd 1 is closed fails on its next write and its job never ends."""
    seen: list[tuple[int, int] | None] = []
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
        except OSError:
            seen.append(None)
            continue
        seen.append((st.st_dev, st.st_ino))
        if seen[-1] not in _STREAM_FILES:
            _STREAM_FILES[seen[-1]] = os.dup(fd)
    return tuple(seen)


def _put_streams(value: tuple[tuple[int, int] | None, ...]) -> None:
    for fd, file in zip((1, 2), value, strict=True):
        if file is not None:
            os.dup2(_STREAM_FILES[file], fd)


def _streams_change(before: tuple, now: tuple) -> str:
    return ", ".join(f"fd {fd} {'closed' if n is None else 'pointed elsewhere'}"
                     for fd, b, n in zip((1, 2), before, now, strict=True) if b != n)


def _no_setter(value: Any) -> None:
    # inference mode is left on by an InferenceMode guard the implementation holds; only that
    # guard can end it, so the process is tainted (per_thread) and its job ends
    raise RuntimeError("torch has no setter for it")


def _autocast(device_type: str) -> Setting:
    return Setting(f"autocast on {device_type}",
                   lambda: torch.is_autocast_enabled(device_type),
                   lambda on: torch.set_autocast_enabled(device_type, on))


def _attribute(owner: str, attr: str) -> Setting:
    return Setting(f"torch.{owner}.{attr}", lambda: getattr(_resolve(owner), attr),
                   lambda value: setattr(_resolve(owner), attr, value))


def _accessor(name: str, getter: str, setter: str) -> Setting:
    return Setting(name, lambda: _resolve(getter)(), lambda value: _resolve(setter)(value))


@functools.cache
def host_settings() -> tuple[Setting, ...]:
    """The settings this torch has that need no CUDA to read."""
    # the default device and dtype first: the rest is read (and the probe made) under them
    every = [Setting("default device", _default_device, _put_default_device),
             _accessor("default dtype", "get_default_dtype", "set_default_dtype")]
    every += [_attribute(o, a) for o, a in _ATTRIBUTES]
    every += [_accessor(*names) for names in _ACCESSORS]
    every += [Setting("flush denormals", _flushes_denormals, torch.set_flush_denormal,
                      per_thread=True),
              Setting("inference mode", torch.is_inference_mode_enabled, _no_setter,
                      per_thread=True),
              Setting("deterministic algorithms", _deterministic, _put_deterministic),
              # pinned to fewer CPUs, the reference and every later case run slower
              Setting("CPU affinity", _affinity, _put_affinity, per_thread=True),
              Setting("anomaly detection", _anomaly, _put_anomaly),
              # the next implementation's relative paths, and a compiler's, resolve there
              Setting("working directory", os.getcwd, os.chdir),
              _autocast("cpu"), _autocast("cuda"),
              Setting("environment", _environment, _put_environment,
                      describe=_environment_change),
              Setting("standard output and error", _streams, _put_streams,
                      describe=_streams_change),
              Setting("torch functions", _Functions, _put_functions, describe=_replaced),
              # a kernel that reseeds or draws from the process's generators changes the
              # random stream of the program that calls it (its dropout, its sampling)
              Setting("torch's global RNG", _rng_bytes(torch.get_rng_state),
                      _rng_put(torch.set_rng_state), describe=_rng_change(
                  "torch.manual_seed, or torch.rand* without generator=", "a torch.Generator")),
              Setting("NumPy's global RNG", _numpy_rng, _put_numpy_rng, describe=_rng_change(
                  "numpy.random.seed or its draws", "a numpy.random.default_rng()")),
              Setting("Python's random module", random.getstate, random.setstate,
                      describe=_rng_change("random.seed or its draws", "a random.Random()"))]
    return tuple(s for s in every if _readable(s.get))


# torch/cuda/__init__.py (read in 2.13): current_device and current_stream call
# _lazy_init, so they are read only where is_initialized(); set_stream sets the stream by id
# on the stream's own device (the device is put back first); a Stream equals another with the
# same stream id, device index and type (torch/cuda/streams.py Stream.__eq__)
# torch/backends/cuda/__init__.py and aten/src/ATen/Context.cpp (read in 2.13): the preferred
# BLAS and linalg libraries' getters read a member of the global context (the BLAS one turns
# "default" into cuBLAS, what default means there), their setters take the enum the getters
# return; they pick cuBLAS or cuBLASLt, cuSOLVER or MAGMA for every later matmul and solve
# torch/cuda/random.py (read in 2.13): get_rng_state() and set_rng_state() without a device
# act on the current device's default generator (put back after the current device, which
# comes first here); its state is the Philox seed and offset, read on the host
_CUDA = (Setting("current CUDA device", lambda: torch.cuda.current_device(),
                 lambda index: torch.cuda.set_device(index)),
         Setting("current CUDA stream", lambda: torch.cuda.current_stream(),
                 lambda stream: torch.cuda.set_stream(stream)),
         Setting("preferred BLAS library", lambda: torch.backends.cuda.preferred_blas_library(),
                 lambda lib: torch.backends.cuda.preferred_blas_library(lib)),
         Setting("preferred linalg library",
                 lambda: torch.backends.cuda.preferred_linalg_library(),
                 lambda lib: torch.backends.cuda.preferred_linalg_library(lib)),
         Setting("CUDA's global RNG", _rng_bytes(lambda: torch.cuda.get_rng_state()),
                 _rng_put(lambda state: torch.cuda.set_rng_state(state)), describe=_rng_change(
             "torch.cuda.manual_seed, or a CUDA draw without generator=",
             "a torch.Generator(device='cuda')")))


def _settings() -> tuple[Setting, ...]:
    # reading the current device or stream before CUDA is up would initialise it
    return host_settings() + (_CUDA if torch.cuda.is_initialized() else ())


def snapshot() -> dict[str, Any]:
    """Every readable setting's value now. The first snapshot of a process draws once from
    torch's global generator: it starts from a fixed seed, so a kernel's
    ``torch.manual_seed(torch.initial_seed())`` would leave a process that never drew from
    it as it was, yet rewind its caller's stream."""
    global _DRAWN
    if not _DRAWN:
        torch.rand(1)
        _DRAWN = True
    values: dict[str, Any] = {}
    for s in _settings():
        try:
            values[s.name] = s.get()
        except Exception:  # torch refuses to say (see ``changed``): nothing to compare with
            continue
    return values


def changed(before: dict[str, Any]) -> list[str]:
    """Each setting whose value differs from ``before``, as "name: before -> now", each put
    back to its ``before`` value. A setting ``before`` lacks (CUDA came up since, or torch
    would not say) is not judged; one torch now refuses to read counts as changed (torch
    2.9+ refuses the legacy float32 matmul precision once the per-backend one was set). A
    per-thread setting found changed taints the process (``tainted``)."""
    global _TAINTED
    said = []
    for s in _settings():
        if s.name not in before:
            continue
        try:
            now = s.get()
        except Exception as exc:
            now = f"unreadable ({type(exc).__name__})"
        if now == before[s.name]:
            continue
        said.append(s.change(before[s.name], now))
        _TAINTED = _TAINTED or s.per_thread
        try:
            s.put(before[s.name])
        except Exception as exc:
            said[-1] += f" (not restored: {type(exc).__name__}: {exc})"
    return said


#: whether ``snapshot`` has drawn from torch's global generator in this process
_DRAWN = False


def tainted() -> bool:
    """Whether a setting that cannot be put back in every thread was changed in this process
    (or ``taint`` was called): its later results cannot be trusted, and a job ends with it."""
    return _TAINTED


def taint() -> None:
    """Mark this process tainted (another rank of its job was: the job ends together)."""
    global _TAINTED
    _TAINTED = True
