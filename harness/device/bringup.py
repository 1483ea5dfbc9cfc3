"""The GPU bring-up checklist: plain facts about a machine in, verdicts out.

``harness env --check`` prints :func:`checklist` line by line and exits 2 when one of them is a
blocker; ``harness run`` stops before launching on :func:`run_blockers`. The facts are gathered
elsewhere (``envinfo.site_facts``), so the CPU tests drive these verdicts through every
situation a site can be in: a CPU-only torch on a GPU host, a driver older than cuda-python
needs, NVRTC missing or of another CUDA major than the driver, CUDA headers of another major
on NVRTC's include path, a compute mode that forbids sharing a GPU, a small ``/dev/shm``, a
GPU-enabled MPI library.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.device.placement import EXCLUSIVE_MODES, TORCH_CUDA_INSTALL, GpuFacts

#: a verdict's level, mildest first
LEVELS = ("ok", "note", "warn", "blocker")
#: NCCL keeps its SHM transport, proxy and NVLS buffers in /dev/shm (a few MiB per peer and
#: channel) and fails to initialise ("failed to extend /dev/shm/nccl-...") when it is full;
#: NVIDIA's NCCL troubleshooting page asks containers for `--shm-size=1g`
SHM_RECOMMENDED = 1 << 30
#: below this, several ranks of one node on NCCL are expected to fail (Docker's default is
#: 64 MiB): `harness run` stops unless NCCL_SHM_DISABLE=1 says the site does without it
SHM_MINIMUM = 256 << 20
#: cuda-bindings 13 and NVRTC 13 need a driver of CUDA 13 (R580 or newer); CUDA 12 drivers
#: (R525 to R575) take cuda-bindings 12 and NVRTC 12 (NVIDIA's minor-version compatibility:
#: a cubin of any 12.x toolkit loads on any 12.x driver, never across a major version)
CUDA12_INSTALL = ("pip uninstall -y nvidia-cuda-nvrtc && pip install 'cuda-bindings>=12.6,<13' "
                  "nvidia-cuda-nvrtc-cu12 (or `pip install -e '.[cuda12]'` after the "
                  "uninstall: cuda-python loads NVRTC 13's wheel first when both are there, "
                  "and the test extra brings it)")
CUDA13_INSTALL = ("pip install 'cuda-bindings>=13' 'nvidia-cuda-nvrtc>=13' "
                  "(or `pip install -e '.[cuda]'`)")


@dataclass(frozen=True)
class Check:
    """One line of the checklist: what was checked, its verdict, and what to do."""

    name: str
    level: str
    detail: str

    def line(self) -> str:
        return f"{self.level.upper():7} {self.name}: {self.detail}"


@dataclass(frozen=True)
class SiteFacts:
    """What one machine offers the harness, as the launching process sees it."""

    torch_version: str = ""
    #: torch.version.cuda: None for a CPU-only build
    torch_cuda: str | None = None
    #: GPUs torch counts (None: not asked, a CPU-only torch)
    torch_gpu_count: int | None = None
    #: cuda-bindings' version, or None when it cannot be imported
    bindings_version: str | None = None
    #: a CUDA driver library is installed (libcuda loads)
    driver_present: bool = False
    #: what cuda-python reported when it could not use the driver ("" when it could, or when
    #: there is no driver at all)
    driver_error: str = ""
    #: the driver's CUDA version as the driver API gives it (12040 for 12.4)
    driver_version: int | None = None
    gpus: tuple[GpuFacts, ...] = ()
    #: GPUs NVML counts (after CUDA_VISIBLE_DEVICES), for when neither cuda-python nor torch
    #: can list them
    nvml_gpu_count: int = 0
    #: devices whose queries failed, with the driver's error
    gpu_errors: tuple[str, ...] = ()
    #: NVRTC "13.5", or None
    nvrtc_version: str | None = None
    #: why compiling is impossible though NVRTC may load (cuda.core missing): nvrtc_missing()
    nvrtc_error: str = ""
    #: CUDART_VERSION of the CUDA runtime headers found for NVRTC's include path (13000)
    headers_version: int | None = None
    headers_path: str = ""
    shm_bytes: int | None = None
    #: MPI segments in /dev/shm that no process holds (harness.device.shm): files, bytes
    shm_leftovers: tuple[int, int] = (0, 0)
    #: NCCL_SHM_DISABLE=1 in the environment
    nccl_shm_disabled: bool = False
    nccl_version: str | None = None
    mpi_library: str | None = None
    #: the MPI library links CUDA (an MPICH built with GPU support), None when unknown
    mpi_gpu: bool | None = None
    #: MPIR_CVAR_ENABLE_GPU as the user set it (None: unset, the launcher sets 0)
    mpich_gpu_setting: str | None = None
    launcher: str | None = None
    mps: bool = False
    #: logical CPUs this process may run on (0: unknown)
    cpus: int = 0
    #: triton is installed (its Triton implementations can run)
    triton: bool = False
    #: why compiled Triton kernels cannot launch here (``triton_impl.driver_problem``)
    triton_problem: str = ""


def version_major(version: str | int | None) -> int | None:
    """The major of "13.5", "12.4.1" or of an API version 12040 (the driver's encoding)."""
    if version is None or version == "":
        return None
    if isinstance(version, int):
        return version // 1000
    head = str(version).split(".", 1)[0]
    return int(head) if head.isdigit() else None


def fmt_api_version(version: int | None) -> str:
    """12040 -> "12.4"."""
    return "?" if version is None else f"{version // 1000}.{(version % 1000) // 10}"


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


# ------------------------------------------------------------------------ the checks
def visible_gpus(f: SiteFacts) -> int:
    """GPUs this machine shows the harness: the driver's (or torch's) list, else NVML's count."""
    return len(f.gpus) or f.nvml_gpu_count


def check_torch(f: SiteFacts) -> Check:
    shown = visible_gpus(f)
    if f.torch_cuda is None:
        if shown:
            return Check("torch", "blocker",
                         f"torch {f.torch_version} is a CPU-only build but {shown} GPU(s) are "
                         f"visible: install a CUDA build of torch ({TORCH_CUDA_INSTALL}), or "
                         "run with --device cpu")
        return Check("torch", "note", f"torch {f.torch_version} (CPU-only build): runs on the "
                                      "CPU")
    if shown and not f.torch_gpu_count:
        tmaj, dmaj = version_major(f.torch_cuda), version_major(f.driver_version)
        why = (f"its CUDA {f.torch_cuda} is newer than the driver's CUDA "
               f"{fmt_api_version(f.driver_version)}: update the driver, or install a torch "
               f"built for CUDA {dmaj}.x ({TORCH_CUDA_INSTALL})"
               if tmaj is not None and dmaj is not None and tmaj > dmaj else
               "check CUDA_VISIBLE_DEVICES and `python -c 'import torch; torch.cuda.init()'`")
        return Check("torch", "blocker", f"torch {f.torch_version} sees no GPU though {shown} "
                                         f"are installed: {why}")
    return Check("torch", "ok", f"torch {f.torch_version}, built for CUDA {f.torch_cuda}, "
                                f"sees {f.torch_gpu_count or 0} GPU(s)")


def driver_problem(f: SiteFacts) -> str:
    """Why cuda-python cannot (fully) use this machine's driver, with the remedy, or "".

    cuda-bindings 13 documents a CUDA 13 driver (R580 or newer) as its requirement; on an
    older driver cuInit may still succeed (it resolves each entry point at the version that
    introduced it), but calls added since raise FunctionNotFoundError and cuda.core warns of
    the major mismatch: the fix is cuda-bindings of the driver's major, not silence."""
    drv, bind = version_major(f.driver_version), version_major(f.bindings_version)
    if drv is not None and bind is not None and bind > drv:
        fix = CUDA12_INSTALL if drv == 12 else f"a cuda-python of CUDA {drv}.x"
        said = f" ({f.driver_error})" if f.driver_error else ""
        return (f"cuda-bindings {f.bindings_version} needs a CUDA {bind} driver; this driver is "
                f"CUDA {fmt_api_version(f.driver_version)}{said}: {fix}, or update the driver "
                "(R580 or newer for CUDA 13)")
    if f.driver_error:
        return (f"cuda-python could not use the driver ({f.driver_error}); check the driver "
                "install (`nvidia-smi`)")
    return ""


def check_driver(f: SiteFacts) -> Check:
    problem = driver_problem(f)
    if problem:
        # torch keeps working through its own runtime: devices are still found through it,
        # but nothing of cuda-python (CUDA C++ implementations, device queries) runs
        level = "warn" if f.gpus or f.torch_gpu_count else "blocker"
        return Check("CUDA driver", level, problem + (
            "; devices are taken from torch meanwhile" if f.driver_error and f.torch_gpu_count
            else ""))
    if not f.driver_present:
        return Check("CUDA driver", "note", "no CUDA driver installed: runs on the CPU")
    return Check("CUDA driver", "ok", f"CUDA {fmt_api_version(f.driver_version)}, "
                                      f"cuda-bindings {f.bindings_version}")


def check_gpus(f: SiteFacts) -> list[Check]:
    out: list[Check] = []
    for err in f.gpu_errors:
        out.append(Check("GPU query", "warn", err))
    if not f.gpus:
        if f.driver_present and not f.driver_error and not f.gpu_errors:
            out.append(Check("GPUs", "note", "the driver sees no GPU: runs on the CPU"))
        return out
    names: dict[str, int] = {}
    for g in f.gpus:
        names[g.name or "unnamed"] = names.get(g.name or "unnamed", 0) + 1
    out.append(Check("GPUs", "ok", ", ".join(f"{n} x {name}" for name, n in names.items())))
    for i, g in enumerate(f.gpus):
        if g.compute_mode == "prohibited":
            out.append(Check(f"GPU {i} compute mode", "blocker",
                             f"{g.uuid} is in prohibited compute mode: no process may use it; "
                             "an administrator sets `nvidia-smi -c DEFAULT`"))
        elif g.compute_mode in EXCLUSIVE_MODES:
            out.append(Check(f"GPU {i} compute mode", "warn" if not f.mps else "ok",
                             f"{g.uuid} is in {g.compute_mode.replace('_', '-')} compute mode: "
                             + ("an MPS daemon lets ranks share it" if f.mps else
                                "one process per GPU, so world sizes above the GPU count fail; "
                                "`nvidia-smi -c DEFAULT` or an MPS daemon lift it")))
    return out


def nvrtc_problem(nvrtc_version: str | None, driver_version: int | None) -> str:
    """Why CUDA C++ implementations cannot compile or load on this driver, with the remedy for
    its CUDA major, or "": NVRTC missing, or of a newer major than the driver."""
    drv = version_major(driver_version)
    if nvrtc_version is None:
        fix = CUDA12_INSTALL if drv == 12 else CUDA13_INSTALL
        return f"NVRTC is not installed or not loadable: {fix}"
    nv = version_major(nvrtc_version)
    if drv is not None and nv is not None and nv > drv:
        fix = CUDA12_INSTALL if drv == 12 else f"an NVRTC of CUDA {drv}.x"
        return (f"NVRTC {nvrtc_version} makes cubins the CUDA {fmt_api_version(driver_version)} "
                f"driver cannot load (a newer major): {fix}, or update the driver")
    return ""


def check_nvrtc(f: SiteFacts) -> Check:
    # what cuda.run_problem says in the ranks: the driver-aware problem, else nvrtc_error
    # (cuda.core missing)
    problem = nvrtc_problem(f.nvrtc_version, f.driver_version) or f.nvrtc_error
    if problem:
        # only CUDA C++ implementations need it: they skip, saying why
        return Check("NVRTC", "warn" if f.gpus else "note",
                     problem + "; CUDA C++ implementations skip until then")
    return Check("NVRTC", "ok", f"NVRTC {f.nvrtc_version}")


def headers_problem(nvrtc_version: str | None, headers_version: int | None) -> str:
    """Why the CUDA runtime headers found must not go on NVRTC's include path, or ""."""
    nv, hv = version_major(nvrtc_version), version_major(headers_version)
    if nv is None or hv is None or nv == hv:
        return ""
    return (f"the CUDA runtime headers found are CUDA {fmt_api_version(headers_version)}, "
            f"NVRTC is {nvrtc_version}: they are left off NVRTC's include path (a kernel that "
            "includes cuda_fp16.h or the like will not compile until headers of the same "
            "major are installed: the nvidia-cuda-runtime wheel or the toolkit)")


def check_headers(f: SiteFacts) -> Check | None:
    if f.nvrtc_version is None:
        return None
    problem = headers_problem(f.nvrtc_version, f.headers_version)
    if problem:
        return Check("CUDA headers", "warn", problem)
    if f.headers_version is None:
        return Check("CUDA headers", "note", "no CUDA runtime headers found: kernels that "
                                             "include cuda_fp16.h or cuda_bf16.h will not compile")
    return Check("CUDA headers", "ok", f"CUDA {fmt_api_version(f.headers_version)} "
                                       f"({f.headers_path})")


def shm_problem(shm_bytes: int | None, gpus: int, shm_disabled: bool) -> tuple[str, str]:
    """(level, text) of /dev/shm for NCCL among ``gpus`` local GPUs; ("", "") when fine."""
    if shm_bytes is None or gpus < 2 or shm_bytes >= SHM_RECOMMENDED:
        return "", ""
    text = (f"/dev/shm holds {_gib(shm_bytes)}; NCCL keeps its shared-memory buffers there and "
            f"fails to start when it is full (give containers `--shm-size=1g`)")
    if shm_bytes < SHM_MINIMUM and not shm_disabled:
        return "blocker", text + ", or set NCCL_SHM_DISABLE=1 where the GPUs talk over NVLink"
    return "warn", text


def check_shm(f: SiteFacts) -> Check | None:
    level, text = shm_problem(f.shm_bytes, len(f.gpus), f.nccl_shm_disabled)
    if level:
        return Check("/dev/shm", level, text)
    if f.shm_bytes is None:
        return None
    return Check("/dev/shm", "ok", _gib(f.shm_bytes))


def check_shm_leftovers(f: SiteFacts) -> Check | None:
    """MPI segments that killed jobs left in /dev/shm: memory no one gets back until reboot,
    which fills a container's /dev/shm in a few jobs."""
    files, size = f.shm_leftovers
    if not files:
        return None
    return Check("/dev/shm leftovers", "warn",
                 f"{files} MPI/NCCL shared-memory file(s) that no process holds take "
                 f"{_gib(size)} of memory (left by killed jobs): `harness env "
                 "--clean-shm` removes them")


def check_mpi(f: SiteFacts) -> Check:
    lib = " ".join((f.mpi_library or "unknown").split())
    if f.mpi_gpu and "mpich" in lib.lower():
        if f.mpich_gpu_setting not in (None, "", "0"):
            return Check("MPI", "warn",
                         f"{lib} is built with GPU support and MPIR_CVAR_ENABLE_GPU="
                         f"{f.mpich_gpu_setting}: it initialises CUDA in every rank (MPICH 4.0 "
                         "makes a context on every visible GPU, which exclusive compute modes "
                         "refuse); unset it unless an implementation hands device memory to MPI")
        return Check("MPI", "ok", f"{lib}, built with GPU support: the ranks run with "
                                  "MPIR_CVAR_ENABLE_GPU=0 (the harness stages device data "
                                  "through the host)")
    if f.mpi_gpu:
        return Check("MPI", "ok", f"{lib} (CUDA-aware)")
    return Check("MPI", "ok", lib)


def check_launcher(f: SiteFacts) -> Check:
    if not f.launcher:
        return Check("MPI launcher", "blocker", "no mpiexec found: `pip install mpich` (or "
                                                "install MPI), or pass --launcher PATH")
    return Check("MPI launcher", "ok", f.launcher)


def check_timing(f: SiteFacts) -> Check | None:
    """How many ranks on this host are timed fully: ranks that outnumber the CPUs, or share a
    GPU, contend, and get one token timed call per case (``placement.contention``)."""
    if not f.cpus:
        return None
    gpus = (len(f.gpus) or f.torch_gpu_count or 0) if f.torch_cuda else 0
    full = min(f.cpus, gpus) if gpus else f.cpus
    have = f"{f.cpus} CPUs" + (f" and {gpus} GPUs" if gpus else "")
    detail = (f"{have}: up to {full} rank(s) on this host are timed fully; more contend and "
              "get one token timed call per case (marked ~, kept out of the regression "
              "series; --bench times them fully)")
    if gpus and full < f.cpus:
        detail += f"; with --device cpu, up to {f.cpus}"
    return Check("timing", "ok" if full >= 8 else "note", detail)


def check_nccl(f: SiteFacts) -> Check | None:
    if f.torch_cuda is None or not (f.gpus or f.torch_gpu_count):
        return None
    if f.nccl_version is None:
        return Check("NCCL", "warn", "torch has no NCCL: multi-GPU runs use gloo")
    return Check("NCCL", "ok", f"NCCL {f.nccl_version}")


def check_triton(f: SiteFacts) -> Check | None:
    """Compiled Triton kernels need a C compiler, Python.h, libcuda and a writable cache on
    the GPU host; without them every Triton implementation skips, saying which is missing."""
    if not (f.gpus or f.torch_gpu_count):
        return None  # on the CPU, Triton's interpreter needs none of them
    if not f.triton:
        return Check("Triton", "note", "triton is not installed: the Triton implementations "
                     "skip (pip install triton)")
    if f.triton_problem:
        return Check("Triton", "warn", f.triton_problem + " (the Triton implementations skip)")
    return Check("Triton", "ok", "a C compiler, Python.h, libcuda and a writable cache for "
                 "its launcher")


def checklist(f: SiteFacts) -> list[Check]:
    """Every verdict about this machine, in bring-up order."""
    out = [check_torch(f), check_driver(f), *check_gpus(f), check_nvrtc(f)]
    out += [c for c in (check_headers(f), check_shm(f), check_shm_leftovers(f), check_nccl(f),
                        check_triton(f)) if c is not None]
    out += [check_mpi(f), check_launcher(f)]
    return out + [c for c in (check_timing(f),) if c is not None]


def worst(checks: Sequence[Check]) -> str:
    return max((c.level for c in checks), key=LEVELS.index, default="ok")


def run_blockers(f: SiteFacts, device: str, world_sizes: Sequence[int]) -> list[str]:
    """What stops ``harness run --device device --world-sizes ...`` before any rank starts:
    one line each, naming the problem and the remedy. Device and rank placement problems that
    only the ranks can see (GPUs bound per rank) are the ranks' own (``placement.place``)."""
    if device == "cpu":
        return []
    out: list[str] = []
    gpus = list(f.gpus)
    torch_check = check_torch(f)
    if torch_check.level == "blocker":
        return [torch_check.detail]
    if not gpus and not f.torch_gpu_count:
        return out  # no GPU: a CPU run (--device cuda is refused by placement)
    for c in check_gpus(f):
        if c.level == "blocker":
            out.append(c.detail)
    if gpus and not f.mps:
        exclusive = [g for g in gpus if g.compute_mode in EXCLUSIVE_MODES]
        over = [w for w in world_sizes if w > len(gpus)]
        if exclusive and over:
            out.append(f"world size {over[0]} puts several ranks on a GPU, but {len(exclusive)}"
                       f" of the {len(gpus)} GPUs are in exclusive-process compute mode: run "
                       f"--world-sizes up to {len(gpus)}, start an MPS daemon, or have an "
                       "administrator set `nvidia-smi -c DEFAULT`")
    nccl_sizes = [w for w in world_sizes if 1 < w <= max(len(gpus), 1)]
    level, text = shm_problem(f.shm_bytes, len(gpus), f.nccl_shm_disabled)
    if level == "blocker" and nccl_sizes:
        out.append(text)
    return out
