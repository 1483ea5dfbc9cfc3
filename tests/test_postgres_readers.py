"""Every reader of the history DB gives the same answer from PostgreSQL as from SQLite for the
same runs: compare, export, detect, triage and the dashboard (`harness report`), through the
real commands, against a real PostgreSQL server (tests/helpers/postgres_server.py); after one
write through them on both, a run's change points triaged at once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.core.results import CaseResult, RunInfo
from harness.history import regress, store

T0 = 1_760_000_000.0


def _result(run_id: str, case: str, impl: str, median: float, status: str = "pass",
            ws: int = 4) -> CaseResult:
    factors = (0.96, 0.98, 1.0, 1.01, 1.03, 1.05, 1.2)
    timing = {"median": median, "p10": median * 0.98, "p90": median * 1.05, "n": len(factors),
              "samples": [median * f for f in factors]}
    return CaseResult(
        run_id=run_id, case_id=f"allreduce[{case}]", op="allreduce", family="collectives",
        impl=impl, world_size=ws, params={"n": 1031, "dtype": "f32"}, status=status,
        reason="" if status == "pass" else "out: 3/1031 elements not bitwise equal",
        timing=timing if status == "pass" else None,
        derived={"gbps": 1.0, "busbw_gbps": 1.5}, wrong=0 if status == "pass" else 3,
        peak_memory_bytes=9 << 30)  # past 2**32: a 64-bit column on both engines


def _history(target: Path | str) -> None:
    """8 nights: torch 30% slower from night 5 on, a control that fails from night 6 on."""
    conn = store.connect(target)
    try:
        for i in range(8):
            run_id = f"r{i}"
            results = [
                _result(run_id, "n=1031", "torch", 1000.0 * (1.3 if i >= 5 else 1.0) + i),
                _result(run_id, "n=65536", "torch", 52_000.0 - 10 * i),
                _result(run_id, "n=1031", "ring", 900.0 + i,
                        status="fail" if i >= 6 else "pass"),
            ]
            info = RunInfo(run_id=run_id, started_at=T0 + 3600 * i, tier="smoke",
                           world_sizes=[4], machine={"fingerprint": "fp-a", "name": "box"},
                           env={"torch": "2.13.0"}, git_commit=f"{i:040d}",
                           status="complete", finished_at=T0 + 3600 * i + 60)
            store.ingest(conn, info, results)
    finally:
        conn.close()


def _cli(capsys, *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out + out.err


def _outputs(capsys, db: str, out_dir: Path) -> dict[str, object]:
    got: dict[str, object] = {}
    for name, args in {
        "report": ("report", "--db", db, "--out", str(out_dir), "--fail-on", "never"),
        "compare": ("compare", "r4", "r7", "--db", db),
        "export": ("export", "r7", "--format", "json", "--db", db),
        "detect": ("detect", db, "--json"),
        "triage": ("triage", "--all", "--json", "--db", db),
    }.items():
        code, text = _cli(capsys, *args)
        text = text.replace(store.db_label(db), "<DB>")
        if name == "report":  # the site's own folder and how long it took differ
            text = "\n".join(line for line in text.splitlines() if not line.startswith("site:"))
        if name == "triage":  # when each change point was last analysed and marked: now
            text = json.dumps([{k: v for k, v in cp.items()
                                if k not in ("updated_at", "triaged_at")}
                               for cp in json.loads(text)])
        got[name] = (code, text)
    # every page names the DB and the second it was rendered, which differ between the two
    rendered = re.compile(rb"rendered \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")
    got["site"] = {str(p.relative_to(out_dir)): rendered.sub(b"rendered <T>", p.read_bytes()
                                                             .replace(store.db_label(db).encode(),
                                                                      b"<DB>"))
                   for p in sorted(out_dir.rglob("*")) if p.is_file()}
    return got


def test_readers_answer_the_same_from_postgresql_as_from_sqlite(tmp_path, postgres_url,
                                                                capsys):
    sqlite = str(tmp_path / "h.db")
    _history(sqlite)
    _history(postgres_url)
    # and one write through the same command on both: a run's change points marked at once
    # (found by the nightly's analysis, which `harness run` stores)
    for db in (sqlite, postgres_url):
        conn = store.connect(db)
        try:
            regress.analyze_ingested(conn, ["r0"])
        finally:
            conn.close()
    [found] = {cp["found_in_run"] for cp in json.loads(_cli(capsys, "triage", "--json", "--db",
                                                             sqlite)[1])}
    for db in (sqlite, postgres_url):
        code, text = _cli(capsys, "triage", "--run", found, "acknowledged", "--note", "seen",
                          "--by", "ana", "--db", db)
        assert code == 0 and "seen (ana)" in text, text
    lite = _outputs(capsys, sqlite, tmp_path / "site-sqlite")
    post = _outputs(capsys, postgres_url, tmp_path / "site-postgres")
    for name in ("compare", "export", "detect", "triage", "report"):
        assert post[name] == lite[name], name
    assert "1 slower" in lite["compare"][1]  # not an empty agreement: the step is seen
    steps = json.loads(lite["detect"][1])
    assert [(d["index"], d["direction"]) for d in steps if "n=1031" in d["series"]
            and "@torch" in d["series"]] == [(5, "up")]
    assert json.loads(lite["triage"][1]) != [] and lite["report"][0] == 0
    assert {cp["triage"] for cp in json.loads(lite["triage"][1])
            if cp["found_in_run"] == found} == {"acknowledged"}
    assert post["site"].keys() == lite["site"].keys() and len(lite["site"]) > 5
    differ = [name for name in lite["site"] if post["site"][name] != lite["site"][name]]
    assert differ == []
