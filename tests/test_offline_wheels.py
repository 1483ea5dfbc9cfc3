"""ci/offline_wheels.py: what a GPU host without internet lacks of the harness's requirements,
fetched for its Python and platform on a connected machine and installed there with
--no-index. The host is the GPU image the harness last ran on (tests/data/gpu_image_host.json,
its `pip list`). The resolving and fetching tests use PyPI, and skip when it cannot be reached.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "ci"))
try:
    import offline_wheels
finally:
    sys.path.remove(str(ROOT / "ci"))

HOST_JSON = Path(__file__).parent / "data" / "gpu_image_host.json"
HOST = json.loads(HOST_JSON.read_text())
_OFFLINE = ("NewConnectionError", "Temporary failure in name resolution",
            "Network is unreachable", "Max retries exceeded", "ConnectTimeout")


def _online(call):
    try:
        return call()
    except RuntimeError as exc:
        if any(s in str(exc) for s in _OFFLINE):
            pytest.skip(f"PyPI cannot be reached: {str(exc).splitlines()[-1]}")
        raise


def test_the_gpu_image_lacks_mpich_and_plotly_alone():
    """It ships torch 2.11, cuda-bindings 13.3 (no cuda-python metapackage), mpi4py without an
    MPI library, and no plotly."""
    names = sorted(r.split(">")[0].split(";")[0].strip()
                   for r in offline_wheels.missing(offline_wheels.requirements([]), HOST))
    assert names == ["mpich", "plotly"]
    test_extra = offline_wheels.missing(offline_wheels.requirements(["test"]), HOST)
    assert any(r.startswith("playwright") for r in test_extra)


def test_markers_and_versions_are_judged_for_the_host():
    host = {**HOST, "packages": {**HOST["packages"], "click": "7.1"}}
    reqs = ["click>=8.1", "tomli; python_version < '3.11'", "pywin32; sys_platform == 'win32'",
            "numpy>=1.24", "Jinja2>=3.1"]
    assert offline_wheels.missing(reqs, host) == ["click>=8.1"]
    old = {**host, "python": "3.10"}
    assert offline_wheels.missing(reqs, old) == ["click>=8.1", "tomli; python_version < '3.11'"]
    with pytest.raises(ValueError, match="no extra 'gpu'"):
        offline_wheels.requirements(["gpu"])


def test_platform_tags_run_from_the_hosts_glibc_down():
    tags = offline_wheels.platforms({"machine": "x86_64", "glibc": "2.28"})
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags and "manylinux_2_29_x86_64" not in tags


def test_describe_reads_this_interpreter():
    proc = subprocess.run([sys.executable, str(ROOT / "ci" / "offline_wheels.py"), "describe"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout)
    assert facts["python"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert facts["implementation"] == "cp" and "pytest" in {n.lower() for n in facts["packages"]}


def test_a_bad_host_file_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "host.json"
    bad.write_text("{}")
    for args in (["plan", str(bad)], ["plan", str(tmp_path / "none.json")], ["fetch"]):
        proc = subprocess.run([sys.executable, str(ROOT / "ci" / "offline_wheels.py"), *args],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, args


def test_the_plan_for_the_gpu_image_is_what_it_lacks_at_versions_its_packages_allow():
    got = _online(lambda: offline_wheels.plan(HOST, []))
    assert sorted(line.split("==")[0] for line in got) == ["mpich", "plotly"]


def test_fetched_wheels_install_offline_beside_what_the_host_has(tmp_path):
    """A host that lacks only click: one wheel fetched, installed with --no-index."""
    host = copy.deepcopy(HOST)
    host["packages"].update({"mpich": "5.0.2", "plotly": "7.1.0"})
    del host["packages"]["click"]
    got = _online(lambda: offline_wheels.download(host, [], tmp_path / "wheels"))
    assert [line.split("==")[0] for line in got] == ["click"]
    wheels = list((tmp_path / "wheels").glob("*.whl"))
    assert len(wheels) == 1
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--target", str(site), *map(str, wheels)], check=True, timeout=120)
    proc = subprocess.run([sys.executable, "-c", "import click; print(click.__file__)"],
                          capture_output=True, text=True, env={"PYTHONPATH": str(site)},
                          timeout=60)
    assert proc.returncode == 0 and str(site) in proc.stdout, proc.stderr
