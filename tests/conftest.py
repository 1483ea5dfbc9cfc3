"""The test process runs implementations in-process on the CPU (harness.engine.local), a CPU rank
of its own: Triton kernels there go through Triton's interpreter, which must be on before
anything imports triton, since triton.language's own ``@jit`` functions (``tl.max``,
``tl.sum``) are compiled or interpreted when triton is imported (harness/device/triton_impl.py)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")


import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent / "helpers"))


@pytest.fixture(scope="module")
def world():
    """A CPU world of one rank, the test process's own (run_case in process)."""
    from harness.device.runtime import World

    return World.from_mpi("cpu", timeout_s=60)


@pytest.fixture(scope="session")
def postgres_server():
    """A real PostgreSQL server for the session (tests/helpers/postgres_server.py), started
    the first time a test asks; skipped with the reason where none can start, except under
    CI (CI=true), where .ci/run installs one and its absence is a failure."""
    import postgres_server
    from services import start_or_skip

    server = start_or_skip(postgres_server.Server, postgres_server.Unavailable, "PostgreSQL")
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server):
    """The URL of a fresh, empty database on the session's server."""
    return postgres_server.database()


@pytest.fixture(scope="session")
def two_node_cluster():
    """A real two-node SLURM cluster for the session (tests/helpers/two_node_cluster.py):
    nodes n1 and n2 of 2 CPUs each, the test process their login node. Skipped with the
    reason where none can start (not root, no unshare/nsenter, no SLURM), except under CI."""
    import two_node_cluster
    from services import start_or_skip

    cluster = start_or_skip(two_node_cluster.TwoNodeCluster, two_node_cluster.Unavailable,
                            "two-node SLURM")
    yield cluster
    cluster.stop()


# the suite in parallel under pytest-xdist (pyproject's addopts: `-n auto --dist loadfile`),
# the longest modules begun first, the tests marked `alone` with no other beside them
from machine_lock import (  # noqa: E402, F401
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_protocol,
    pytest_unconfigure,
    pytest_xdist_auto_num_workers,
)
