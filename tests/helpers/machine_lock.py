"""The suite in parallel (pytest-xdist; tests/conftest.py takes these hooks): the longest
modules begun first (``LONGEST``); every test holds
a shared lock on one file while it runs (setup and teardown, module fixtures included); a test
marked ``alone``, or a fixture inside :func:`alone`, holds it exclusively, so that no other
test runs beside it. Which ones: those whose verdict compares times taken at different moments
(a load that comes and goes between them reads as a change) and those that read what every
process on the machine holds (another test's MPI job holds its shared memory). Without xdist
there is no lock and nothing waits."""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

#: where the controller tells its workers the lock file's path (they inherit its environment)
ENV = "KERNEL_HARNESS_TEST_LOCK"
#: the controller's lock file, removed when its run ends
_PATH = pytest.StashKey[str]()

_fd: int | None = None


def hold(exclusive: bool) -> None:
    """Take the lock, shared or exclusive, converting the one held (flock drops it first, so
    two workers that both convert cannot deadlock)."""
    if _fd is not None:
        fcntl.flock(_fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)


@contextmanager
def alone() -> Iterator[None]:
    """The machine to this worker alone for the block (a module fixture's run, say), then
    shared again, as the test around it holds it."""
    hold(True)
    try:
        yield
    finally:
        hold(False)


#: the modules that take longest on a 2-core VM, longest first (their shared MPI runs and
#: end-to-end tests): begun in this order (a module per worker, `--no-loadscope-reorder`), so
#: that the short modules come last and fill in around the long ones, instead of a long one
#: begun last running on one worker while the other has nothing left
LONGEST = ("test_negative_controls.py", "test_smoke_tier.py", "test_cli_integration.py",
           "test_dashboard_browser.py", "test_golden_and_regression_e2e.py", "test_golden.py",
           "test_ci_pipelines.py", "test_exchange.py", "test_faults.py",
           "test_external_suites.py", "test_resume.py", "test_cli_compare.py",
           "test_warm_start.py", "test_honest_times.py", "test_wrong_kernels.py",
           "test_cuda_source.py", "test_machine_lock.py", "test_calibrate.py", "test_store.py",
           "test_cuda_kernels_on_host.py", "test_changepoints.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item):
        name = item.path.name
        return LONGEST.index(name) if name in LONGEST else len(LONGEST)

    items.sort(key=rank)  # stable: each module's tests keep their order


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Up to four workers, one per CPU; none on one CPU, nor for the heavy tests, whose
    SLURM clusters must come up one at a time."""
    marks = config.option.markexpr or ""
    if "heavy" in marks and "not heavy" not in marks:
        return 0
    cpus = len(os.sched_getaffinity(0))
    return min(cpus, 4) if cpus > 1 else 0


def pytest_configure(config: pytest.Config) -> None:
    global _fd
    config.addinivalue_line("markers", "alone: no other test runs beside this one "
                                       "(tests/helpers/machine_lock.py)")
    if hasattr(config, "workerinput"):
        if os.environ.get(ENV) and _fd is None:
            _fd = os.open(os.environ[ENV], os.O_RDWR)
    elif getattr(config.option, "numprocesses", 0):
        fd, path = tempfile.mkstemp(prefix="kernel-harness-tests-", suffix=".lock")
        os.close(fd)
        os.environ[ENV] = path
        config.stash[_PATH] = path


def pytest_unconfigure(config: pytest.Config) -> None:
    if _PATH in config.stash:
        Path(config.stash[_PATH]).unlink(missing_ok=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    hold(item.get_closest_marker("alone") is not None)
    try:
        return (yield)
    finally:
        if _fd is not None:  # between tests, so that a worker waiting for it gets it
            fcntl.flock(_fd, fcntl.LOCK_UN)
