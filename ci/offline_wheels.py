"""Wheels for a GPU host that has no internet and a Python of its own (a cluster image with its
CUDA torch): what the host lacks of the harness's requirements, fetched on a connected machine
for the host's Python and platform, installed there beside the image's torch with --no-index.

    # 1. on the GPU host (standard library only):
    python3 ci/offline_wheels.py describe > host.json
    # 2. on a connected machine, in this repository:
    python3 ci/offline_wheels.py plan host.json [--extra NAME ...]       # what it would fetch
    python3 ci/offline_wheels.py download host.json wheels/ [--extra NAME ...]
    # 3. copy wheels/ to the host; there, in this repository:
    python3 -m pip install --no-index --no-deps wheels/*.whl
    python3 -m pip install --no-deps --no-build-isolation -e .

Only requirements the host does not satisfy are fetched, with the versions pip's resolver picks
when every package of the host is pinned at its installed version (so a new wheel never needs a
newer torch, cuda-bindings or numpy than the image has), and none the host already holds at
that version. Exit status: 0; 1 when pip fails (its message follows); 2 for bad usage.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
USAGE = ("usage: ci/offline_wheels.py describe | plan HOST_JSON [--extra NAME ...] | "
         "download HOST_JSON DIR [--extra NAME ...]")


def describe() -> dict:
    """This interpreter's facts, for the connected machine (standard library only: it runs on
    the GPU host before anything is installed there)."""
    from importlib import metadata

    libc, version = platform.libc_ver()
    packages = {}
    for dist in metadata.distributions():
        name = dist.metadata.get("Name")
        if name:
            packages[name] = dist.version
    return {"python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "implementation": sys.implementation.name[:2] if sys.implementation.name ==
            "cpython" else sys.implementation.name,
            "machine": platform.machine(), "glibc": version if libc == "glibc" else "",
            "packages": dict(sorted(packages.items(), key=lambda kv: kv[0].lower()))}


def requirements(extras: list[str]) -> list[str]:
    """The harness's requirements (pyproject.toml), with those of the extras named."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = list(project["dependencies"])
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise ValueError(f"no extra {extra!r} in pyproject.toml; there are: "
                             + ", ".join(sorted(optional)))
        out += optional[extra]
    return out


def _environment(host: dict) -> dict[str, str]:
    """The markers' environment on the host (PEP 508), from its description."""
    return {"python_version": host["python"], "python_full_version": host["python"] + ".0",
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
            "platform_machine": host["machine"], "extra": ""}


def missing(reqs: list[str], host: dict) -> list[str]:
    """The requirements the host's installed packages do not satisfy (markers evaluated for
    the host)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    have = {canonicalize_name(n): v for n, v in host["packages"].items()}
    env = _environment(host)
    out = []
    for text in reqs:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        installed = have.get(canonicalize_name(req.name))
        try:
            ok = installed is not None and req.specifier.contains(Version(installed),
                                                                  prereleases=True)
        except InvalidVersion:
            ok = False
        if not ok:
            out.append(text)
    return out


def platforms(host: dict) -> list[str]:
    """The wheel platform tags the host takes, newest manylinux first."""
    machine = host["machine"]
    major, minor = (int(x) for x in (host.get("glibc") or "2.17").split(".")[:2])
    tags = [f"manylinux_{major}_{m}_{machine}" for m in range(minor, 16, -1)]
    return tags + [f"manylinux2014_{machine}", f"manylinux2010_{machine}",
                   f"manylinux1_{machine}", f"linux_{machine}"]


def _target_options(host: dict) -> list[str]:
    opts = ["--only-binary=:all:", "--python-version", host["python"], "--implementation",
            host.get("implementation", "cp")]
    for tag in platforms(host):
        opts += ["--platform", tag]
    return opts


def plan(host: dict, extras: list[str]) -> list[str]:
    """``name==version`` of every wheel the host needs, as pip's resolver picks them with the
    host's packages pinned; none the host has at that version."""
    from packaging.utils import canonicalize_name

    wanted = missing(requirements(extras), host)
    if not wanted:
        return []
    have = {canonicalize_name(n): v for n, v in host["packages"].items()}
    with tempfile.TemporaryDirectory() as tmp:
        pins = Path(tmp) / "host-pins.txt"
        pins.write_text("".join(f"{n}=={v}\n" for n, v in host["packages"].items()))
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
               "--quiet", "--report", str(report), "--target", str(Path(tmp) / "t"),
               *_target_options(host), "-c", str(pins), *wanted]
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
        if proc.returncode != 0:
            raise RuntimeError("pip could not resolve the host's missing requirements "
                               f"({' '.join(wanted)}):\n{proc.stderr.strip()}")
        chosen = json.loads(report.read_text())["install"]
    out = []
    for item in chosen:
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if have.get(canonicalize_name(name)) != version:
            out.append(f"{name}=={version}")
    return sorted(out, key=str.lower)


def download(host: dict, extras: list[str], dest: Path) -> list[str]:
    wanted = plan(host, extras)
    if wanted:
        dest.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                               *_target_options(host), "-d", str(dest), *wanted],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"pip download failed:\n{proc.stderr.strip()}")
    return wanted


def main(argv: list[str]) -> int:
    if argv[:1] == ["describe"] and len(argv) == 1:
        print(json.dumps(describe(), indent=1))
        return 0
    extras = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--extra"]
    rest = [a for i, a in enumerate(argv) if a != "--extra" and (i == 0 or argv[i - 1]
                                                                 != "--extra")]
    if not rest or rest[0] not in ("plan", "download") or \
            len(rest) != (2 if rest[0] == "plan" else 3):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        host = json.loads(Path(rest[1]).read_text())
        host["packages"], host["python"], host["machine"]  # noqa: B018 - the keys it needs
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"offline_wheels: {rest[1]} is not a host description ({exc}); make it on the "
              "host with `python3 ci/offline_wheels.py describe > host.json`", file=sys.stderr)
        return 2
    try:
        if rest[0] == "plan":
            for line in plan(host, extras):
                print(line)
            return 0
        got = download(host, extras, Path(rest[2]))
    except ValueError as exc:
        print(f"offline_wheels: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"offline_wheels: {exc}", file=sys.stderr)
        return 1
    print(f"{len(got)} wheel(s) in {rest[2]}: {' '.join(got) or 'none needed'}")
    print(f"on the host: python3 -m pip install --no-index --no-deps {rest[2]}/*.whl && "
          "python3 -m pip install --no-deps --no-build-isolation -e .")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
