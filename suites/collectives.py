"""Collectives: allreduce, allgather (plain, and ZeRO-3's bulk and sequential parameter
gathers), reduce_scatter, all_to_all (equal and uneven splits) and broadcast (any root), each
with torch.distributed and mpi4py implementations and negative controls.

One module per op lives in suites/_collectives/; this family module gathers their specs.
"""

from __future__ import annotations

from suites._collectives.all_to_all import ALL_TO_ALL
from suites._collectives.allgather import ALLGATHER
from suites._collectives.allreduce import ALLREDUCE
from suites._collectives.broadcast import BROADCAST
from suites._collectives.reduce_scatter import REDUCE_SCATTER

FAMILY = "collectives"

SPECS = [ALLREDUCE, ALLGATHER, REDUCE_SCATTER, ALL_TO_ALL, BROADCAST]
