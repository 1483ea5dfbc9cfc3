"""`harness calibrate`: measure the device's copy bandwidth and matmul peak, store them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from harness.cli.common import EXIT_INFRA, EXIT_USAGE, HarnessExit, console, err_console


def _device(choice: str) -> Any:
    """The torch device to calibrate; --device cuda without a GPU is a usage error."""
    import torch

    if choice == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if choice == "cuda":
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only"
        raise HarnessExit(f"--device cuda: torch ({build} build) sees no CUDA device: use "
                          "--device cpu, or run on a machine with a GPU and a CUDA torch",
                          EXIT_USAGE)
    return torch.device("cpu")


def _remove_made(made: Path) -> None:
    """The DB file (and its SQLite side files), or the folder made for it, that a refused
    calibration leaves empty."""
    if made.is_dir():
        shutil.rmtree(made, ignore_errors=True)
        return
    for path in (made, *(made.with_name(made.name + s) for s in ("-wal", "-shm", "-journal"))):
        path.unlink(missing_ok=True)


def _table(cal: dict[str, Any], cal_id: int) -> Table:
    table = Table(title=f"calibration {cal_id}: {escape(cal['device_name'] or cal['device'])}",
                  title_justify="left")
    table.add_column("measure")
    table.add_column("peak", justify="right")
    d = cal["details"]
    table.add_row(f"copy ({d['copy_bytes'] // 2**20} MiB, read + write)",
                  f"{cal['copy_gbps']:.1f} GB/s")
    for dtype, tflops in cal["matmul_tflops"].items():
        table.add_row(f"matmul {dtype} ({d['matmul_n']}^3)", f"{tflops:.3g} TFLOP/s")
    for dtype, why in d.get("skipped", {}).items():
        table.add_row(f"matmul {dtype}", f"[yellow]skipped[/yellow]: {escape(why)}")
    notes = ["--quick: rough figures"] if d["quick"] else []
    if d.get("busy"):
        notes.append(f"taken on a busy machine ({d['cpu_share']:.0%} of its threads' CPU "
                     "time): low peaks")
    table.caption = "; ".join(notes) or None
    return table


@click.command("calibrate")
@click.option("--device", "device_choice", default="auto", show_default=True,
              type=click.Choice(["auto", "cpu", "cuda"]),
              help="What to measure (auto: the current CUDA device when there is one).")
@click.option("--db", default=None, help="History DB (default $HARNESS_DB or "
                                         "harness-results/history.db).")
@click.option("--quick", is_flag=True,
              help="Smaller buffers and fewer repeats: seconds, but rougher figures.")
@click.option("--even-if-busy", is_flag=True,
              help="Store a CPU calibration whose repeats got less than 80% of their threads' "
                   "CPU time (other processes ran beside them; refused with exit 4 without "
                   "this): its peaks are low, and times past twice them fail as impossible.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def calibrate(device_choice: str, db: str | None, quick: bool, even_if_busy: bool,
              as_json: bool) -> None:
    """Measure copy bandwidth and matmul TFLOP/s per dtype, and store them for this machine.

    Runs report their throughput as a percentage of the newest calibration of the same
    machine and device. Each peak is the fastest repeat; on the CPU a calibration taken while
    other processes took CPU time from it is refused (exit 4).
    """
    from harness.device import envinfo
    from harness.engine import calibrate as calibrate_mod
    from harness.engine.warm import first_missing
    from harness.history import sql, store

    device = _device(device_choice)
    db_path = store.resolve_db_path(db)
    # what opening the DB makes, removed again if the calibration is refused
    made = (first_missing(db_path) if isinstance(db_path, Path) and not db_path.exists()
            else None)
    # open the DB first: a bad --db must fail before a minute of measuring, not after
    try:
        conn = store.connect(db_path)
    except sql.StoreError as exc:
        raise HarnessExit(str(exc), EXIT_USAGE) from exc
    refused = None
    try:
        if not as_json:
            err_console.print(f"calibrating {device} ({'quick' if quick else 'full'})...")
        cal = calibrate_mod.measure(device, quick=quick, even_if_busy=even_if_busy)
        machine = envinfo.machine()
        cal_id = store.save_calibration(conn, machine, cal)
    except sql.StoreError as exc:
        raise HarnessExit(str(exc), EXIT_USAGE) from exc
    except calibrate_mod.BusyMachine as exc:
        refused = exc
    finally:
        conn.close()
    if refused is not None:  # with the DB closed, what opening it made can go
        if made is not None and made.exists():
            _remove_made(made)
        raise HarnessExit(str(refused), EXIT_INFRA) from refused
    if as_json:
        click.echo(json.dumps({"id": cal_id, "db": str(db_path),
                               "machine_fingerprint": machine["fingerprint"], **cal},
                              indent=2, sort_keys=True))
    else:
        console.print(_table(cal, cal_id))
        console.print(f"stored in {escape(str(db_path))}", soft_wrap=True)
