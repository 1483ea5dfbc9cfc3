"""Faults injected into real harness processes: which are survived, how, and what is lost.

Each fault is injected into real processes: `harness run` with its mpiexec ranks, a real
PostgreSQL server (Debian's, started as the tests start it), real files, a real tmpfs. After
each, the checks a user would make: the line harness printed (one line, naming the cause and
the fix), the results the run stored against those of a clean run of the same cases (none
lost; every status and output hash the same), the history DB's integrity, `harness golden
verify`, and no process of the run left behind. A fault is survived when every check holds.

    python benchmarks/faults.py [--only NAME ...] [--json benchmarks/results/faults.json]

Faults that need what is missing here (PostgreSQL, root for a tmpfs) are listed as skipped
with the reason; the figure counts the faults that ran.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "helpers"))

import _fault_inputs  # noqa: E402
from _faultkit import (  # noqa: E402
    SELECTION,
    Lab,
    Row,
    Skip,
    against_clean,
    fill,
    finish,
    grow,
    integrity,
    keyed,
    no_orphans,
    one_line,
    rank_pid,
    recorded,
    run_ids,
    tmpfs,
    wait_for,
)
from _figures import command, machine  # noqa: E402
from _figures import record as record_figure  # noqa: E402


def clean_run(lab: Lab) -> dict:
    """The selection run without a fault: what every faulted run must end up agreeing with."""
    where = lab.dir("clean")
    done = lab.run("run", *SELECTION, "--db", str(where / "h.db"), cwd=where)
    if done.rc != 0:
        raise SystemExit(f"the clean run failed ({done.rc}): {done.err[-2000:]}")
    return keyed(where / "h.db")


# ---------------------------------------------------------------------------- PostgreSQL
def _server():
    try:
        import postgres_server

        return postgres_server.Server()
    except Exception as exc:  # noqa: BLE001 - Unavailable, or psycopg missing
        raise Skip(str(exc).splitlines()[0]) from exc


def _waiting_on_lock(url: str) -> bool:
    """Whether a session of ``url``'s database waits for a lock (the run's, on the locked
    table)."""
    import psycopg

    dbname = url.rsplit("/", 1)[1]
    with psycopg.connect(url, autocommit=True) as conn:
        return bool(conn.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE datname = %s "
                                 "AND wait_event_type = 'Lock'", (dbname,)).fetchone()[0])


def pg_restart(lab: Lab, server, clean: dict, table: str, stage: str) -> Row:
    """The server restarted while the run's ingest (``table`` results) or analysis
    (``table`` change_points) waits inside the DB: a lock held on the table keeps it there."""
    import psycopg

    from harness.history import store

    row = Row(f"PostgreSQL restarted during a run's {stage}",
              f"LOCK TABLE {table} held until the run waits on it, then pg_ctl stop -m fast "
              "and start")
    url = server.database()
    store.connect(url).close()  # the schema, so the lock has a table to hold
    where = lab.dir(f"pg-{stage}")
    locker = psycopg.connect(url)
    locker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    proc = lab.start("run", *SELECTION, "--db", url, "--out-dir", str(where), cwd=where)
    wait_for(f"the run's {stage} waited on the lock", lambda: _waiting_on_lock(url), proc=proc)
    server.halt()
    server.start()
    locker.close()
    done = finish(proc)
    last = (done.out.strip().splitlines() or [""])[-1]
    row.saw = f"nothing but its usual last line: {last}" if done.rc == 0 else done.line
    row.need(done.rc == 0, f"the run exits 0 (got {done.rc})")
    ids = run_ids(url)
    row.need(len(ids) == 1, "the run stored once")
    against_clean(row, keyed(url, ids[0]) if ids else {}, clean)
    row.need(integrity(url) == "ok", "DB consistent and the run analysed")
    return row.done()


def pg_unreachable(lab: Lab, server, clean: dict) -> Row:
    """The server down for the whole run; started again, `harness ingest` stores the run."""
    row = Row("PostgreSQL unreachable when a run starts",
              "pg_ctl stop before `harness run --db postgresql://...`; start after it")
    url = server.database()
    server.halt()
    where = lab.dir("pg-down")
    try:
        done = lab.run("run", *SELECTION, "--db", url, "--out-dir", str(where), cwd=where)
    finally:
        server.start()
    one_line(row, done.line, "cannot be reached", "harness ingest")
    row.need(done.rc == 4, f"exit 4, infrastructure (got {done.rc})")
    row.need("the run goes on" in done.err, "warned at the start, and ran")
    dirs = [p for p in where.iterdir() if (p / "results.jsonl").exists()]
    row.need(len(dirs) == 1, "its run folder kept")
    if dirs:
        later = lab.run("ingest", str(dirs[0]), "--db", url, cwd=where)
        row.need(later.rc == 0, f"`harness ingest` exits 0 once the server is back "
                                f"(got {later.rc})")
        against_clean(row, keyed(url, dirs[0].name), clean, "the ingested run")
        row.need(integrity(url) == "ok", "DB consistent and the run analysed")
    return row.done()


# ---------------------------------------------------------------------------- disk and DB
def disk_full(lab: Lab, clean: dict) -> Row:
    """The run folder's file system fills up mid-run; once grown, --resume finishes."""
    row = Row("disk full under the run folder",
              "--out-dir on a 24 KiB tmpfs (fills after a few results); remount at 4 MiB, "
              "then --resume")
    where = lab.dir("disk-full")
    db = where / "h.db"
    with tmpfs(where / "mnt", "24k") as mnt:
        done = lab.run("run", *SELECTION, "--db", str(db), "--out-dir", str(mnt), cwd=where)
        one_line(row, done.line, "is full", "--resume")
        row.need(done.rc == 4, f"exit 4, infrastructure (got {done.rc})")
        run_dir = next(mnt.iterdir())
        kept = (run_dir / "results.jsonl").read_bytes().count(b"\n")
        row.need(kept > 0, f"what was written stays ({kept} results)")
        grow(mnt, "4m")
        again = lab.run("run", "--resume", run_dir.name, "--db", str(db), "--out-dir", str(mnt),
                        cwd=where)
        row.need(again.rc == 0, f"--resume exits 0 once there is space (got {again.rc})")
        against_clean(row, keyed(db, run_dir.name), clean, "the resumed run")
        row.need(integrity(db) == "ok", "DB consistent and the run analysed")
    return row.done()


def db_disk_full(lab: Lab, clean: dict) -> Row:
    """The SQLite history's file system full when a run ends: its results are shown from the
    run folder, and `harness ingest` stores them once there is space."""
    from harness.history import store

    row = Row("disk full under the SQLite history",
              "the DB on a 256 KiB tmpfs filled to the last byte; remount at 4 MiB, then "
              "`harness ingest`")
    where = lab.dir("db-disk-full")
    with tmpfs(where / "mnt", "256k") as mnt:
        db = mnt / "h.db"
        store.connect(db).close()  # the schema, before the disk fills
        fill(mnt / "filler")
        done = lab.run("run", *SELECTION, "--db", str(db), "--out-dir", str(where), cwd=where)
        one_line(row, done.line, "full", "harness ingest")
        row.need(done.rc == 4, f"exit 4, infrastructure (got {done.rc})")
        row.need("not stored" in done.out, "its results shown, from the run folder")
        grow(mnt, "4m")
        run_dir = next(p for p in where.iterdir() if (p / "results.jsonl").exists())
        later = lab.run("ingest", str(run_dir), "--db", str(db), cwd=where)
        row.need(later.rc == 0, f"`harness ingest` exits 0 once there is space (got {later.rc})")
        against_clean(row, keyed(db, run_dir.name), clean, "the ingested run")
        row.need(integrity(db) == "ok", "DB consistent and the run analysed")
    return row.done()


def corrupt_sqlite(lab: Lab, clean: dict, how: str) -> Row:
    """A damaged history file: every command that opens it says so in one line, and it is
    never written to; its runs come back from their folders into a new file."""
    row = Row(f"SQLite history file {how}",
              "bytes 8192-8391 overwritten" if how == "damaged" else "cut to half its size")
    source = lab.root / "clean"
    where = lab.dir(f"sqlite-{how}")
    db = where / "h.db"
    data = bytearray((source / "h.db").read_bytes())
    if how == "damaged":
        data[8192:8392] = b"\x5a" * 200
    else:
        data = data[:len(data) // 2]
    db.write_bytes(bytes(data))
    seen = []
    for args in (("run", *SELECTION), ("ingest", *map(str, (source / "runs").iterdir())),
                 ("report", "--out", str(where / "site"))):
        done = lab.run(*args, "--db", str(db), cwd=where)
        seen.append((args[0], done))
        row.need(db.read_bytes() == bytes(data), f"`harness {args[0]}` leaves the file as it was")
    for name, done in seen[:2]:
        row.need(done.rc == 2, f"`harness {name}` exits 2 (got {done.rc})")
    one_line(row, seen[0][1].line, "corrupt", "move it away")
    fresh = lab.run("ingest", *map(str, (source / "runs").iterdir()), "--db",
                    str(where / "new.db"), cwd=where)
    row.need(fresh.rc == 0, "its run folders ingest into a new file")
    against_clean(row, keyed(where / "new.db"), clean, "the re-ingested runs")
    return row.done()


# ---------------------------------------------------------------------------- signals
def rank_killed(lab: Lab, clean: dict) -> Row:
    """A rank killed by SIGKILL mid-case: that case is a crash naming the signal, the job is
    relaunched for the rest, and the case run again agrees with a clean run."""
    row = Row("one rank killed by SIGKILL mid-case", "kill -9 of rank 0 once 2 cases are "
              "recorded (as the OOM killer does)")
    where = lab.dir("rank-killed")
    db = where / "h.db"
    proc = lab.start("run", *SELECTION, "--db", str(db), cwd=where)
    results = wait_for("2 cases recorded", lambda: recorded(where / "runs", 2), proc=proc)
    pid = wait_for("a rank started", lambda: rank_pid(results.parent), proc=proc)
    os.kill(pid, signal.SIGKILL)
    done = finish(proc)
    run_id = results.parent.name
    row.need(done.rc == 1, f"exit 1, a crash (got {done.rc})")
    got = keyed(db, run_id)
    crashed = [k for k, (status, _) in got.items() if status == "crash"]
    row.need(len(crashed) == 1, "exactly one case recorded as a crash")
    line = next((ln for ln in done.out.splitlines() if ln.startswith("CRASH")), "")
    one_line(row, line, "SIGKILL", "OOM")
    row.lost = len(set(clean) - set(got))
    row.need(row.lost == 0, "every other case run by a relaunched job")
    no_orphans(row, run_id)
    if crashed:
        case, impl, w = crashed[0]
        again = lab.run("run", case, "--world-sizes", str(w), "--impl", impl, "--no-bench",
                        "--db", str(db), cwd=where)
        later = [r for r in run_ids(db) if r != run_id]
        row.need(again.rc == 0, "the crashed case passes when run again")
        row.need(bool(later) and keyed(db, later[0]).get(crashed[0]) == clean[crashed[0]],
                 "and its output hash is a clean run's")
    row.need(integrity(db) == "ok", "DB consistent")
    return row.done()


def harness_stopped(lab: Lab, clean: dict, sig: signal.Signals) -> Row:
    """`harness run` stopped by ``sig`` mid-run; --resume finishes it, each case once."""
    code = 128 + int(sig)
    row = Row(f"`harness run` stopped by {sig.name}",
              f"kill -{sig.name[3:]} of harness once 2 cases are recorded")
    where = lab.dir(f"stopped-{sig.name}")
    db = where / "h.db"
    proc = lab.start("run", *SELECTION, "--db", str(db), cwd=where)
    results = wait_for("2 cases recorded", lambda: recorded(where / "runs", 2), proc=proc)
    proc.send_signal(sig)
    done = finish(proc)
    run_id = results.parent.name
    one_line(row, done.line, sig.name, f"--resume {run_id}")
    row.need(done.rc == code, f"exit {code} (got {done.rc})")
    no_orphans(row, run_id)
    again = lab.run("run", "--resume", run_id, "--db", str(db), cwd=where)
    row.need(again.rc == 0, f"--resume exits 0 (got {again.rc})")
    lines = [json.loads(x) for x in results.read_text().splitlines()]
    keys = [(d["case_id"], d["impl"], d["world_size"]) for d in lines]
    row.need(len(keys) == len(set(keys)), "no case recorded twice")
    against_clean(row, keyed(db, run_id), clean, "the resumed run")
    row.need(integrity(db) == "ok", "DB consistent and the run analysed")
    return row.done()


FAULTS = {
    "pg_restart_ingest": lambda lab, clean, pg: pg_restart(lab, pg(), clean, "results",
                                                           "ingest"),
    "pg_restart_analysis": lambda lab, clean, pg: pg_restart(lab, pg(), clean,
                                                             "change_points", "analysis"),
    "pg_unreachable": lambda lab, clean, pg: pg_unreachable(lab, pg(), clean),
    "disk_full": lambda lab, clean, pg: disk_full(lab, clean),
    "db_disk_full": lambda lab, clean, pg: db_disk_full(lab, clean),
    "sqlite_damaged": lambda lab, clean, pg: corrupt_sqlite(lab, clean, "damaged"),
    "sqlite_truncated": lambda lab, clean, pg: corrupt_sqlite(lab, clean, "truncated"),
    "rank_sigkill": lambda lab, clean, pg: rank_killed(lab, clean),
    "harness_sigint": lambda lab, clean, pg: harness_stopped(lab, clean, signal.SIGINT),
    "harness_sigterm": lambda lab, clean, pg: harness_stopped(lab, clean, signal.SIGTERM),
    **_fault_inputs.FAULTS,
}


def table(rows: list[Row]) -> str:
    lines = ["| fault | injected | survived | results lost | what the user saw |",
             "|---|---|---|---|---|"]
    for r in rows:
        verdict = "yes" if r.survived else "NO: " + "; ".join(r.problems)
        lines.append(f"| {r.fault} | {r.injected} | {verdict} | {r.lost} | "
                     f"{r.saw or '-'} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", choices=sorted(FAULTS), default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write the figure here")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args()
    lab = Lab(Path(tempfile.mkdtemp(prefix="harness-faults-")))
    server = None

    def pg():
        nonlocal server
        server = server or _server()
        return server

    t0 = time.perf_counter()
    rows, skipped = [], {}
    try:
        clean = clean_run(lab)
        for name in args.only or list(FAULTS):
            try:
                row = FAULTS[name](lab, clean, pg)
            except Skip as exc:
                skipped[name] = str(exc)
                print(f"{name}: skipped ({exc})", flush=True)
                continue
            except Exception as exc:  # noqa: BLE001 - a fault the harness did not survive
                row = Row(name, "-", problems=[f"{type(exc).__name__}: {exc}"[:400]])
            rows.append(row)
            print(f"{name}: {'survived' if row.survived else 'NOT survived'} "
                  f"({'; '.join(row.problems) or 'all checks held'})", flush=True)
    finally:
        if server is not None:
            server.stop()
        if not args.keep:
            shutil.rmtree(lab.root, ignore_errors=True)
    for r in rows:  # the scratch folder's name means nothing to a reader
        r.saw = r.saw.replace(str(lab.root), "<scratch>")[:400]
    print(table(rows))
    survived = sum(r.survived for r in rows)
    lost = sum(r.lost for r in rows if isinstance(r.lost, int))
    print(f"{survived} of {len(rows)} faults survived, {lost} results lost, "
          f"{len(skipped)} skipped, in {time.perf_counter() - t0:.0f} s")
    if args.only is None:
        record_figure(
            "faults", figure="faults injected into real runs, DBs and files: survived of "
            "injected, results lost (each fault: benchmarks/RESULTS.md#faults)",
            value=f"{survived} of {len(rows)}", unit=f"faults survived, {lost} results lost",
            command=command(__file__), machine=machine(), details={
                "seconds": round(time.perf_counter() - t0),
                "skipped": skipped,
                "table": {"columns": ["fault", "injected", "survived", "results lost",
                                      "what the user saw"],
                          "rows": [[r.fault, r.injected,
                                    "yes" if r.survived else "NO: " + "; ".join(r.problems),
                                    r.lost, r.saw] for r in rows]}},
            headline=True, out=args.json)
    return 0 if survived == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
