"""Issue 9's acceptance in a real browser: `harness demo` (real runs, real MPI ranks, a real
SQLite file) plus `harness report`, opened from file:// in headless Chromium (Debian's
`chromium`, driven by Playwright). Every page loads without a JavaScript error or a failed
request, its charts are drawn (plotly's SVG is in the page), the numbers on the pages are the
DB's (read here with plain SQL), and a case name with HTML in it stays text on every page.

Screenshots of the index and of op pages go to $HARNESS_TEST_ARTIFACTS (default
test-artifacts/ at the repository root). Without Chromium or Playwright the tests skip with
the reason, except under CI (CI=true), where a missing browser is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import machine_lock
import pytest

from tests.test_cli_integration import harness

pytestmark = pytest.mark.mpi

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(os.environ.get("HARNESS_TEST_ARTIFACTS", ROOT / "test-artifacts"))
EVIL = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">'


def _chromium() -> str:
    path = os.environ.get("HARNESS_CHROMIUM") or shutil.which("chromium") or shutil.which(
        "chromium-browser")
    why = None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        why = "playwright is not installed (pip install -e '.[test]')"
    if path is None:
        why = "no Chromium: apt-get install chromium (Debian), or set HARNESS_CHROMIUM"
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"the browser test must run in CI: {why}")
        pytest.skip(why)
    return str(path)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A quick demo history (8 nights of real runs of the kernel under development: three at
    the old level, a slow one, and four at the new, the last of them with the planted bug, so
    that the change point rests on enough
    runs to be significant even when a loaded machine makes the nights differ; the
    selection on the last 2 nights, at world size 2 only, which still draws busbw, to spare CI
    a minute) and its rendered site."""
    tmp = tmp_path_factory.mktemp("demo")
    # --slow-night: night 4 a little slow, as a busy machine makes a night before a step: the
    # change points must be dated at night 5 all the same
    with machine_lock.alone():  # its nights' times are compared with each other
        out = harness(tmp, "demo", "--quick", "--slow-night", "--nights", "8", "--world-sizes",
                      "2", "--db", str(tmp / "demo.db"), "--out", str(tmp / "site"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return tmp, out


@pytest.fixture(scope="module")
def browser():
    path = _chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield b
        b.close()


class Page:
    """One page opened from file://, with every console error, page error, failed request
    and dialog it produced."""

    def __init__(self, browser, path: Path) -> None:
        assert path.is_file(), path
        self.problems: list[str] = []
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.page.on("console", lambda m: self.problems.append(f"console {m.type}: {m.text}")
                     if m.type in ("error", "warning") else None)
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("requestfailed", lambda r: self.problems.append(f"request failed: {r.url}"))
        self.page.on("dialog", lambda d: (self.problems.append(f"dialog: {d.message}"),
                                          d.dismiss()))
        self.page.goto(path.as_uri())
        self.page.wait_for_load_state("load")

    def js(self, expr: str):
        return self.page.evaluate(expr)

    def drawn(self, selector: str = ".chart") -> tuple[int, int]:
        """(charts plotly has drawn, charts on the page)."""
        return (self.js(f"document.querySelectorAll('{selector} .main-svg').length ? "
                        f"Array.from(document.querySelectorAll('{selector}')).filter("
                        "d => d.querySelector('.main-svg')).length : 0"),
                self.js(f"document.querySelectorAll('{selector}').length"))

    def scroll_through(self) -> None:
        """Scroll to the bottom in steps, as a reader would (charts draw when near view)."""
        height = self.js("document.body.scrollHeight")
        for y in range(0, height + 1000, 800):
            self.js(f"window.scrollTo(0, {y})")
            self.page.wait_for_timeout(30)
        self.page.wait_for_timeout(300)

    def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / name
        self.js("window.scrollTo(0, 0)")  # the top of the page, as it opens
        self.page.wait_for_timeout(200)
        self.page.screenshot(path=str(path), full_page=False)
        return path

    def __enter__(self) -> Page:
        return self

    def __exit__(self, *exc) -> None:
        self.page.close()


def sql(db: Path, query: str, *params):
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute(query, params)]


def test_demo_made_real_runs_with_the_planted_slowdown_and_bug(demo):
    tmp, out = demo
    db = tmp / "demo.db"
    runs = sql(db, "SELECT run_id, argv FROM runs ORDER BY started_at")
    # 8 nights of the kernel under development, the selection on the last 2 (--quick)
    assert len(runs) == 10
    kernel = "suites._demo:copy_under_development"
    rows = sql(db, "SELECT r.run_id, r.case_id, r.status, r.median_ns FROM results r "
                   "JOIN runs USING (run_id) WHERE r.impl = ? ORDER BY runs.started_at", kernel)
    by_case: dict[str, list[dict]] = {}
    for r in rows:
        by_case.setdefault(r["case_id"], []).append(r)
    step = next(v for k, v in by_case.items() if "view=step" in k)
    contiguous = next(v for k, v in by_case.items() if "view=contiguous" in k)
    # the slowdown: 2 ms planted on nights 5 to 8 of a copy that takes microseconds
    assert step[4]["median_ns"] > max(r["median_ns"] for r in step[:4]) + 1.5e6
    assert [r["status"] for r in step] == ["pass"] * 8
    assert [r["status"] for r in contiguous] == ["pass"] * 7 + ["fail"]  # the tail bug
    # what a failure below needs to be read: the nightly medians the analysis judged
    medians = [round(r["median_ns"]) for r in step]
    findings = {(f["run_id"], f["kind"], f["case_id"]) for f in sql(
        db, "SELECT run_id, kind, case_id FROM findings WHERE impl = ?", kernel)}
    # night 4, slowed a little (the planted slow night), is between the two levels: the
    # slowdown is found once, by night 5 (night 4 and 5 both off the old level), 6 or 7, in each
    # case, dated at night 5 where it began, with night 4 as the earliest it may have begun, or
    # night 3 or 2 where those were already off the level before them by the series' own noise
    # (a CI run's night 3 was 4% up on 0.2%-tight samples) (against the middle of nights 1-3: a
    # loaded machine once made night 1 alone 2x the others)
    assert step[3]["median_ns"] > 1.5 * sorted(r["median_ns"] for r in step[:3])[1], medians
    regressions = sorted((f[2], f[0]) for f in findings if f[1] == "regression")
    assert [c for c, _ in regressions] == sorted([step[4]["case_id"],
                                                  contiguous[4]["case_id"]]), medians
    assert {r for _, r in regressions} <= {step[i]["run_id"] for i in (4, 5, 6)}, medians
    points = sql(db, "SELECT case_id, run_id, earliest_run_id, direction, state, triage "
                     "FROM change_points WHERE impl = ?", kernel)
    # the planted one is the only slower change point of each case. A copy of microseconds
    # on a loaded 2-core machine may also get a faster one: two nights 60% slow in a row at
    # the start (a CI run had 8613, 8612, 5313, 5273 ns) are a level of their own, left as an
    # improvement
    ups = sorted((p for p in points if p["direction"] == "up"), key=lambda p: p["case_id"])
    earliest = {p["case_id"]: p.pop("earliest_run_id") for p in ups}
    assert ups == sorted([
        {"case_id": case[4]["case_id"], "run_id": case[4]["run_id"], "direction": "up",
         "state": "open", "triage": None} for case in (step, contiguous)],
        key=lambda p: p["case_id"]), (points, medians)
    for case in (step, contiguous):
        may_begin = {r["run_id"] for r in case[1:4]}
        if case[3]["median_ns"] <= 2 * max(r["median_ns"] for r in case[:3]):
            # night 4 within twice a night of the old level a loaded machine slowed (night 1
            # once 2x; in a full-suite run night 2 was 1.6x and night 4 2.7x the level, which
            # the analysis took for the old level's noise): it may be the old level's, and
            # the step's first night is surely night 5
            may_begin.add(None)
        assert earliest[case[4]["case_id"]] in may_begin, (points, medians)
    assert (contiguous[7]["run_id"], "new_failure", contiguous[7]["case_id"]) in findings
    assert "site: " in out.stdout and (tmp / "site" / "index.html").is_file()


def test_index_renders_with_charts_and_the_db_state(demo, browser):
    tmp, _ = demo
    site, db = tmp / "site", tmp / "demo.db"
    with Page(browser, site / "index.html") as page:
        assert page.drawn("#fig-runs") == (1, 1)
        bars = page.js("document.getElementById('fig-runs').data.map(t => [t.name, t.y])")
        # the runs chart's bars are the DB's counts per run and status
        runs = sql(db, "SELECT run_id FROM runs ORDER BY started_at, run_id")
        for name, ys in bars:
            expected = [sql(db, "SELECT count(*) AS n FROM results WHERE run_id = ? AND "
                                "status = ?", r["run_id"], name)[0]["n"] for r in runs]
            assert ys == expected, name
        text = page.js("document.body.innerText")
        assert "new failure" in text and "copy_under_development" in text
        # the kernel's cell: its latest results, one of the two cases failing
        cell = page.js("Array.from(document.querySelectorAll('table.matrix tr')).find(tr => "
                       "tr.textContent.includes('copy_under_development'))"
                       ".querySelector('td.cell').textContent")
        assert cell.strip() == "1/2"
        timed_ops = sql(db, "SELECT count(DISTINCT op) AS n FROM results WHERE status = "
                            "'pass' AND median_ns > 0")[0]["n"]
        assert page.js("document.querySelectorAll('svg.spark polyline').length") == timed_ops
        page.shot("dashboard-index.png")
        assert page.problems == []


def test_op_pages_draw_every_chart_with_the_db_numbers_and_markers(demo, browser):
    tmp, _ = demo
    site, db = tmp / "site", tmp / "demo.db"
    with Page(browser, site / "ops" / "strided_copy.html") as page:
        page.scroll_through()
        drawn, total = page.drawn()
        assert total == 2 and drawn == total
        step_case = next(r["case_id"] for r in sql(
            db, "SELECT DISTINCT case_id FROM results WHERE case_id LIKE ?", "%view=step%"))
        figs = page.js("Array.from(document.querySelectorAll('.chart')).map(d => ({"
                       "case: d.closest('section').dataset.text, data: d.data.map(t => ({"
                       "name: t.name, y: t.y, symbol: t.marker && t.marker.symbol, "
                       "yaxis: t.yaxis}))}))")
        fig = next(f for f in figs if f["case"] == step_case)
        medians = [r["median_ns"] / 1e3 for r in sql(
            db, "SELECT median_ns FROM results JOIN runs USING (run_id) WHERE case_id = ? "
                "ORDER BY runs.started_at", step_case)]
        line = next(t for t in fig["data"]
                    if (t["name"] or "").endswith("w1") and t["yaxis"] == "y")
        assert line["y"] == pytest.approx(medians, rel=1e-12)
        # the regression is marked on the latency trend, once, at night 5 where it began
        [mark] = [t for t in fig["data"] if t["symbol"] == ["triangle-up"]]
        assert mark["y"] == pytest.approx([medians[4]], rel=1e-12)
        page.shot("dashboard-op-strided_copy.png")
        assert page.problems == []

    with Page(browser, site / "ops" / "allreduce.html") as page:
        assert page.drawn("#fig-busbw") == (1, 1)
        points = page.js("document.getElementById('fig-busbw').data.filter(t => t.mode === "
                         "'markers').flatMap(t => t.y)")
        newest = sql(db, "SELECT run_id FROM results JOIN runs USING (run_id) WHERE op = "
                         "'allreduce' ORDER BY runs.started_at DESC LIMIT 1")[0]["run_id"]
        busbw = [r["busbw_gbps"] for r in sql(
            db, "SELECT busbw_gbps FROM results WHERE run_id = ? AND op = 'allreduce' AND "
                "busbw_gbps > 0", newest)]
        assert sorted(points) == pytest.approx(sorted(busbw), rel=1e-12)
        page.scroll_through()
        drawn, total = page.drawn()
        assert drawn == total > 0
        page.shot("dashboard-op-allreduce.png")
        assert page.problems == []


def test_run_page_numbers_are_the_db_numbers(demo, browser):
    tmp, _ = demo
    site, db = tmp / "site", tmp / "demo.db"
    last = sql(db, "SELECT run_id FROM runs ORDER BY started_at DESC LIMIT 1")[0]["run_id"]
    with Page(browser, site / "runs" / f"{last}.html") as page:
        shown = page.js("Object.fromEntries(Array.from(document.querySelectorAll("
                        "'#results tbody tr')).map(tr => [tr.dataset.key, "
                        "tr.querySelector('td.median').textContent.trim()]))")
        rows = sql(db, "SELECT case_id, impl, world_size, median_ns, status FROM results "
                       "WHERE run_id = ?", last)
        assert len(shown) == len(rows) > 0
        for r in rows:
            key = f"w{r['world_size']}:{r['case_id']}@{r['impl']}"
            want = "-" if r["median_ns"] is None else f"{r['median_ns'] / 1e3:.1f}"
            assert shown[key] == want, key
        # the failure shows its first bad element as the record has it
        failed = [r for r in rows if r["status"] == "fail"]
        assert failed
        record = json.loads(sql(db, "SELECT record FROM results WHERE run_id = ? AND "
                                    "status = 'fail'", last)[0]["record"])
        metrics = record["outputs"]["out"]["metrics"]
        text = page.js("document.querySelector('.failure').innerText")
        assert f"(flat {metrics['first_bad_index']}, rank 0)" in text
        assert str(metrics["first_bad_position"]) in text
        assert page.problems == []
    compare = sorted((site / "compare").glob(f"*_{last}.html"))
    assert len(compare) == 1
    with Page(browser, compare[0]) as page:
        assert "new failure" in page.js("document.body.innerText")
        assert page.problems == []


def test_a_case_name_with_html_stays_text_on_every_page(demo, browser, tmp_path):
    tmp, _ = demo
    db = tmp_path / "evil.db"
    shutil.copyfile(tmp / "demo.db", db)
    last = sql(db, "SELECT run_id FROM runs ORDER BY started_at DESC LIMIT 1")[0]["run_id"]
    exported = harness(tmp_path, "export", last, "--db", str(db), "--format", "json")
    assert exported.returncode == 0, exported.stderr
    doc = json.loads(exported.stdout)
    # a run from "another runner" whose names carry HTML, ingested like any other
    doc["run"]["run_id"] = "evil-run"
    doc["run"]["started_at"] += 60
    doc["run"]["machine"]["name"] = EVIL
    doc["run"]["git_commit"] = EVIL
    for r in doc["results"]:
        r["run_id"] = "evil-run"
        r["case_id"] = r["case_id"].replace("[", f"[{EVIL},", 1)
        r["impl"] = EVIL
        r["reason"] = EVIL
    (tmp_path / "evil.json").write_text(json.dumps(doc))
    ingested = harness(tmp_path, "ingest", str(tmp_path / "evil.json"), "--db", str(db))
    assert ingested.returncode == 0, ingested.stdout + ingested.stderr
    site = tmp_path / "site"
    out = harness(tmp_path, "report", "--db", str(db), "--out", str(site))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 10
    for path in pages:
        raw = path.read_text(encoding="utf-8")
        assert "<script>window.__xss" not in raw, path
        assert "<img src=x" not in raw, path
    evil_pages = [site / "index.html", site / "runs" / "evil-run.html",
                  site / "ops" / "strided_copy.html",
                  next((site / "compare").glob("*_evil-run.html"))]
    for path in evil_pages:
        with Page(browser, path) as page:
            page.scroll_through()
            assert page.js("window.__xss") is None, path
            assert EVIL in page.js("document.body.innerText"), path  # shown, as text
            drawn, total = page.drawn()
            assert drawn == total, path
            # plotly labels (legend, hover) get the name as text too, never as markup
            assert page.js("document.querySelectorAll('.main-svg script, .main-svg img')"
                           ".length") == 0
            assert page.problems == [], (path, page.problems)


def test_report_judges_the_runs_it_is_told_for_ci_and_triage_silences(demo, tmp_path):
    tmp, _ = demo
    db = tmp_path / "demo.db"  # a copy: triage writes to it
    shutil.copyfile(tmp / "demo.db", db)
    kernel_runs = [r["run_id"] for r in sql(
        db, "SELECT DISTINCT run_id FROM results JOIN runs USING (run_id) WHERE impl = ? "
            "ORDER BY runs.started_at", "suites._demo:copy_under_development")]

    def report(*args):
        return harness(tmp_path, "report", "--db", str(db), "--out", str(tmp_path / "s"), *args)

    # night 4, the slow one, is not judged a regression alone
    slow = report("--run", kernel_runs[3][:8], "--fail-on", "regression")
    assert slow.returncode == 0 and "0 untriaged regression(s)" in slow.stdout
    # nights 5 to 8: the tail bug fails (correctness beats speed) and the regressions are
    # reported beside it, with the range to bisect where the analysis dated one (night 4 may
    # read as the old level's noise: test_demo_made_real_runs_with_the_planted_slowdown_and_bug)
    nights = [a for i in (4, 5, 6, 7) for a in ("--run", kernel_runs[i][:8])]
    last = report(*nights, "--fail-on", "regression")
    # (a finding says what its run knew; a later run may date its change point anew)
    said = any("as early as run" in f["detail"] for f in sql(
        db, "SELECT detail FROM findings WHERE kind = 'regression'"))
    ranged = any(p["earliest_run_id"] for p in sql(
        db, "SELECT earliest_run_id FROM change_points WHERE direction = 'up'"))
    assert last.returncode == 1 and "FAIL w1 strided_copy[" in last.stdout
    assert "REGRESSION w1 strided_copy[" in last.stdout
    assert ("as early as run" in last.stdout) == said, last.stdout
    assert "2 untriaged regression(s)" in last.stdout
    # the reader triages them: no longer counted, and the dashboard shows the mark
    listed = harness(tmp_path, "triage", "--db", str(db), "--json")
    # the planted slowdown (a loaded machine's slow first nights may add an improvement)
    ups = [str(p["id"]) for p in json.loads(listed.stdout) if p["direction"] == "up"]
    assert len(ups) == 2, listed.stdout
    marked = harness(tmp_path, "triage", *ups, "acknowledged", "--note",
                     "planted by the demo", "--db", str(db))
    assert marked.returncode == 0, marked.stdout + marked.stderr
    after = report(*nights, "--fail-on", "regression")
    assert after.returncode == 1 and "0 untriaged regression(s)" in after.stdout
    index = (tmp_path / "s" / "index.html").read_text()
    assert "acknowledged" in index and "planted by the demo" in index
    # the range to bisect (tests/test_reports.py renders one whatever the machine's noise)
    assert ("or as early as" in index and "bisect that range" in index) == ranged
    bad = report("--run", "zzzz", "--fail-on", "failure")
    assert bad.returncode == 2 and "unknown run id 'zzzz'" in bad.stderr


def test_run_with_report_renders_after_the_run(tmp_path):
    case = "allreduce[dtype=f32,inplace=false,mode=exact,n=1031,op=sum]"
    out = harness(tmp_path, "run", case, "--world-sizes", "1", "--no-bench", "--impl",
                  "harness_test_impls:off_by_one", "--report", "site")
    # the run's own verdict stands: a failing run still exits 1 after rendering
    assert out.returncode == 1 and "site: " in out.stdout, out.stdout[-2000:] + out.stderr
    run_id = sql(tmp_path / "h.db", "SELECT run_id FROM runs")[0]["run_id"]
    page = (tmp_path / "site" / "runs" / f"{run_id}.html").read_text()
    assert case in page and "not bitwise equal" in page


def test_report_without_a_db_is_one_line_and_exit_2(tmp_path):
    out = harness(tmp_path, "report", "--db", str(tmp_path / "none.db"), "--out",
                  str(tmp_path / "site"))
    assert out.returncode == 2
    assert "does not exist" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "none.db").exists()


def test_chromium_is_debians(browser):
    """The browser the tests drive is the system's Chromium, not a downloaded build."""
    version = subprocess.run([_chromium(), "--version"], capture_output=True, text=True)
    assert "Chromium" in version.stdout
