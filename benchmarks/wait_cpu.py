"""How much CPU a rank burns while it waits in a collective: gloo, and MPICH with and
without ``MPIR_CVAR_ENABLE_HEAVY_YIELD``.

Rank 0 sleeps one second before joining an allreduce; every other rank is already in it.
The CPU time (``time.process_time``) each waiting rank spends in that second is what it
takes from the ranks it waits for when ranks outnumber the cores. Prints one line per
setting with the mean over the waiting ranks:

    python benchmarks/wait_cpu.py [--world-size 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from _figures import command, machine, record

WAIT_S = 1.0


def worker() -> None:
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    torch.set_num_threads(1)
    store = None
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False)
    port = comm.bcast(store.port if store is not None else None, root=0)
    if rank != 0:
        store = dist.TCPStore("127.0.0.1", port, size, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
    t = torch.ones(4)
    dist.all_reduce(t)
    burnt = {}
    for kind in ("gloo", "mpi"):
        comm.Barrier()
        if rank == 0:
            time.sleep(WAIT_S)
        c0 = time.process_time()
        if kind == "gloo":
            dist.all_reduce(t)
        else:
            comm.allreduce(1)
        burnt[kind] = time.process_time() - c0
    everyone = comm.gather(burnt, root=0)
    if rank == 0:
        print(json.dumps({k: sum(b[k] for b in everyone[1:]) / (size - 1) for k in burnt}))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker()
        return 0
    from harness.device.envinfo import find_launcher

    mpiexec = find_launcher()  # what `harness run` launches with
    if mpiexec is None:
        sys.exit("no mpiexec: `pip install mpich`")
    print(f"CPU seconds a waiting rank burns in {WAIT_S:g} s ({args.world_size} ranks, "
          f"{len(os.sched_getaffinity(0))} CPUs)")
    seconds = {}
    for heavy in ("0", "1"):
        env = {**os.environ, "MPIR_CVAR_ENABLE_HEAVY_YIELD": heavy, "MPIR_CVAR_ENABLE_GPU": "0"}
        out = subprocess.run([mpiexec, "-n", str(args.world_size), sys.executable, __file__,
                              "--worker"], capture_output=True, text=True, env=env)
        if out.returncode != 0:
            sys.exit(out.stdout[-2000:] + out.stderr[-2000:])
        burnt = json.loads(out.stdout.strip().splitlines()[-1])
        if heavy == "0":
            print(f"  gloo allreduce                         {burnt['gloo']:.3f}")
            seconds["gloo_s"] = burnt["gloo"]
        print(f"  MPI allreduce, MPIR_CVAR_ENABLE_HEAVY_YIELD={heavy}  {burnt['mpi']:.3f}")
        seconds["mpich_heavy_yield_s" if heavy == "1" else "mpich_s"] = burnt["mpi"]
    record(f"wait_cpu_w{args.world_size}",
           figure=f"CPU a rank burns while it waits 1 s for rank 0 in an allreduce, "
                  f"{args.world_size} ranks: gloo / MPICH / MPICH with "
                  "MPIR_CVAR_ENABLE_HEAVY_YIELD=1",
           value=" / ".join(f"{seconds[k]:.3f}" for k in ("gloo_s", "mpich_s",
                                                           "mpich_heavy_yield_s")),
           unit="CPU s", command=command(__file__, *sys.argv[1:]), machine=machine(),
           details={k: round(v, 3) for k, v in seconds.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
