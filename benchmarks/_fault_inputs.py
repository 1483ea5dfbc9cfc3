"""The faults of benchmarks/faults.py that lie in files a user gives: goldens damaged or
written by two processes at once, and hostile CSVs for `harness detect`."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path

from _faultkit import GOLDEN_SELECTION, ROOT, Lab, Row, one_line

GOLDEN = ROOT / "suites" / "golden"
#: the case whose golden is damaged, and its file (committed, under suites/golden)
CASE = "w1:hopper_tasks.rmsnorm[b=2,hidden=768]"


def _golden_copy(lab: Lab, name: str) -> tuple[Path, Path, dict]:
    """A scratch copy of the rmsnorm goldens with their manifest: (dir, the case's file,
    the manifest)."""
    where = lab.dir(name)
    gdir = where / "golden"
    manifest = json.loads((GOLDEN / "manifest.json").read_text())
    keep = {k: e for k, e in manifest["entries"].items() if "hopper_tasks.rmsnorm" in k}
    for entry in keep.values():
        (gdir / entry["file"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(GOLDEN / entry["file"], gdir / entry["file"])
    manifest["entries"] = keep
    (gdir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return gdir, gdir / keep[CASE]["file"], manifest


def _damage(how: str, gdir: Path, path: Path, manifest: dict) -> None:
    data = path.read_bytes()
    text = (gdir / "manifest.json").read_text()
    if how == "golden file truncated":
        path.write_bytes(data[:100])
    elif how == "golden file altered (one bit)":
        path.write_bytes(data[:-3] + bytes([data[-3] ^ 1]) + data[-2:])
    elif how == "golden file altered, its sha256 updated":
        path.write_bytes(data[:-3] + bytes([data[-3] ^ 1]) + data[-2:])
        manifest["entries"][CASE]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        (gdir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    elif how == "manifest truncated":
        (gdir / "manifest.json").write_text(text[: len(text) // 2])
    elif how == "manifest entry removed":
        del manifest["entries"][CASE]
        (gdir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    elif how == "manifest deleted":
        (gdir / "manifest.json").unlink()


def golden_damaged(lab: Lab, how: str) -> Row:
    """A damaged golden: the run never passes the case and names the file; verify fails."""
    row = Row(how, "in a copy of the committed goldens, before `harness run --golden-dir`")
    gdir, path, manifest = _golden_copy(lab, "golden-" + "-".join(how.split()[:3]))
    where = gdir.parent
    _damage(how, gdir, path, manifest)
    done = lab.run("run", *GOLDEN_SELECTION, "--golden-dir", str(gdir), "--db",
                   str(where / "h.db"), cwd=where)
    row.need(done.rc == 1, f"the run exits 1 (got {done.rc})")
    case = CASE.split(":", 1)[1]
    failed = [ln for ln in done.out.splitlines() if ln.startswith(("FAIL", "ERROR"))]
    whole = how in ("manifest truncated", "manifest deleted")  # every golden in doubt
    mine = [ln for ln in failed if case in ln]
    row.need(len(mine) == 1, "the damaged case does not pass")
    if whole:
        row.need(len(failed) == 2, "no case of the directory passes")
    else:
        row.need(len(failed) == 1, "the undamaged case passes")
    needle = "manifest" if how.startswith("manifest") else path.name
    one_line(row, mine[0] if mine else done.line, needle)
    verify = lab.run("golden", "verify", *GOLDEN_SELECTION[:4], "--golden-dir", str(gdir),
                     cwd=where)
    row.need(verify.rc != 0, f"`harness golden verify` fails (got {verify.rc})")
    return row.done()


def concurrent_generate(lab: Lab) -> Row:
    """Two `harness golden generate` at once into one directory: each adds its entries."""
    row = Row("two `harness golden generate` at once",
              "hopper_tasks.* and moe.* (81 goldens) started together into one empty "
              "--golden-dir, three times")
    for attempt in range(3):
        gdir = lab.dir(f"generate-{attempt}") / "golden"
        procs = [subprocess.Popen(lab.cmd("golden", "generate", sel, "--world-sizes", "1",
                                          "--golden-dir", str(gdir)),
                                  cwd=lab.root, env=lab.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
                 for sel in ("hopper_tasks.*", "moe.*")]
        codes = [p.wait(timeout=600) for p in procs]
        row.need(codes == [0, 0], f"both exit 0 (got {codes})")
        try:
            entries = json.loads((gdir / "manifest.json").read_text())["entries"]
        except (OSError, ValueError) as exc:
            row.need(False, f"the manifest reads as JSON ({exc})")
            continue
        verify = lab.run("golden", "verify", "hopper_tasks.*", "moe.*", "--world-sizes", "1",
                         "--golden-dir", str(gdir), cwd=lab.root)
        row.need(verify.rc == 0, "`harness golden verify` of both passes")
        row.lost = len(_planned(lab)) - len(entries)
        row.need(row.lost == 0, "the manifest lists every golden of both")
    row.saw = "nothing: both finished"
    return row.done()


def _planned(lab: Lab) -> list:
    done = lab.run("list", "hopper_tasks.*", "moe.*", "--world-sizes", "1", "--json",
                   cwd=lab.root)
    return sorted({(d["case_id"], d["world_size"]) for d in json.loads(done.out)})


# ---------------------------------------------------------------------------- detect
def _csv(rows: list[tuple]) -> str:
    return "series,order,value\n" + "".join(",".join(map(str, r)) + "\n" for r in rows)


def _step(name: str, n: int = 40) -> list[tuple]:
    return [(name, i, 10 if i < n // 2 else 13) for i in range(n)]


#: (what, the CSV's text, the exit code, what the output must hold)
HOSTILE = [
    ("a value that is not a number", _csv([("a", 1, 1.0), ("a", 2, "abc")]), 2, "line 3"),
    ("NaN and inf values", _csv([("a", i, "nan" if i == 5 else 1.0) for i in range(30)]), 2,
     "not a finite number"),
    ("duplicate orders (the samples of one run)",
     _csv([("a", i // 3, 10 if i < 60 else 13) for i in range(120)]), 0, "index 20"),
    ("a million rows", None, 2, "at most 10000"),
    ("a series name of HTML and shell", _csv(_step('"<script>alert(1)</script>$(touch x)"')),
     0, "<script>alert(1)</script>$(touch x)"),
    ("a series name with terminal escapes", _csv(_step("a\x1b[2Jb")), 0, "a\\x1b[2Jb"),
    ("rich markup and emoji codes", _csv(_step("[bold]x:smile:")), 0, "[bold]x:smile:"),
    ("not UTF-8", "\udcff", 2, "not a UTF-8 CSV"),
    ("no header", "a,1,2\n", 2, "no column"),
]


def hostile_csv(lab: Lab) -> Row:
    """Hostile CSVs for `harness detect`: each a correct result or one line, in bounded time;
    nothing in them runs."""
    row = Row("hostile `harness detect` CSVs", "; ".join(h[0] for h in HOSTILE))
    where = lab.dir("detect")
    lines = []
    for what, text, code, needle in HOSTILE:
        path = where / (what.split()[1] + ".csv")
        if text is None:
            with path.open("w") as fh:
                fh.write("series,order,value\n")
                for i in range(1_000_000):
                    fh.write(f"s{i % 10},{i // 10},{10 + (i >= 500_000) * 2 + (i % 7) / 10}\n")
        else:
            path.write_bytes(text.encode("utf-8", "surrogateescape"))
        t0 = time.perf_counter()
        done = lab.run("detect", str(path), cwd=where, timeout=300)
        seconds = time.perf_counter() - t0
        row.need(seconds < 120, f"{what}: answered in {seconds:.0f} s")
        row.need(done.rc == code, f"{what}: exit {code} (got {done.rc})")
        shown = done.out if code == 0 else done.line
        row.need(needle in shown, f"{what}: says {needle!r}")
        if code:
            row.need("\n" not in done.err.strip(), f"{what}: one line")
            lines.append(done.line)
    row.need(not (where / "x").exists(), "nothing in a CSV ran")
    row.saw = lines[0] if lines else ""
    return row.done()


GOLDEN_HOW = {"golden_truncated": "golden file truncated",
              "golden_bit_flipped": "golden file altered (one bit)",
              "golden_edited": "golden file altered, its sha256 updated",
              "manifest_truncated": "manifest truncated",
              "manifest_entry_removed": "manifest entry removed",
              "manifest_deleted": "manifest deleted"}
def _golden_fault(how: str):
    return lambda lab, clean, pg: golden_damaged(lab, how)


FAULTS = {
    **{name: _golden_fault(how) for name, how in GOLDEN_HOW.items()},
    "golden_generate_twice": lambda lab, clean, pg: concurrent_generate(lab),
    "detect_hostile_csv": lambda lab, clean, pg: hostile_csv(lab),
}
