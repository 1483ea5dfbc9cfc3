"""The ``harness`` command line.

Exit codes: 0 all passed; 1 a correctness failure (fail, error, timeout, crash); 2 bad usage or
configuration; 4 the infrastructure failed (no MPI launcher, a job that keeps dying before it
runs a case). Errors a user can cause print one line naming the problem and the remedy; pass
``--debug`` for the traceback.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from harness.cli.common import (  # noqa: F401 - re-exported for callers
    EXIT_FAIL,
    EXIT_INFRA,
    EXIT_OK,
    EXIT_REGRESSION,
    EXIT_USAGE,
    HarnessExit,
    _fail,
    console,
    err_console,
    fmt_us,
    load_project,
    parse_world_sizes,
    suite_option,
)
from harness.core.discovery import BUILTIN_SUITE


def resolve_plans(selectors: Sequence[str], tier: str, sizes: Sequence[int],
                  impls: Sequence[str], device: str = "auto"
                  ) -> tuple[list[Any], dict[int, list[Any]], Any]:
    """The selected op specs, the items to run per world size on ``device`` and that device
    (resolved as rank 0 resolves it); usage errors exit 2. A CUDA C++ source named by --impl
    is compiled here first, so that a compile error stops the run before any rank starts."""
    from torch import device as torch_device

    from harness.core.discovery import registry
    from harness.core.spec import SpecError
    from harness.device.runtime import RuntimeSetupError, resolve_device

    try:
        resolved = torch_device(resolve_device(device).device)
    except RuntimeSetupError as exc:
        raise HarnessExit(str(exc), EXIT_USAGE) from exc
    try:
        reg = registry()
        specs = reg.select(list(selectors), tier)
        reg.check_impls(specs, list(impls))
        plans = {w: reg.plan(tier, w, list(selectors), list(impls), resolved.type)
                 for w in sizes}
    except SpecError as exc:
        raise HarnessExit(str(exc), EXIT_USAGE) from exc
    _compile_cuda_sources(impls)
    return specs, plans, resolved


def note_shared_impls(specs: Sequence[Any], impls: Sequence[str]) -> None:
    """One stderr line per requested name that several selected ops have (it runs on all)."""
    from harness.core.discovery import registry

    for name, ops in registry().shared_impl_names(specs, list(impls)).items():
        click.echo(f"note: --impl {name} is a name of {len(ops)} selected ops "
                   f"({', '.join(ops)}): it runs on each; select one op to run only its own",
                   err=True)


def _compile_cuda_sources(impls: Sequence[str]) -> None:
    """Compile every ``path.cu:launch`` implementation for this machine's GPU (sm_90 without
    one) where NVRTC is installed: a compile error exits 2 with the compiler's log."""
    from harness.core.spec import load_callable
    from harness.device import cuda

    sources = [name for name in impls if name.partition(":")[0].endswith(".cu")]
    if not sources or cuda.nvrtc_missing():
        return
    arch = cuda.driver_arch()
    for name in sources:
        try:
            load_callable(name).compile(arch)  # type: ignore[attr-defined]
        except cuda.CudaCompileError as exc:
            err_console.print(escape(exc.full()), highlight=False)
            raise HarnessExit(f"--impl {name}: {exc.headline} (compiling for {arch}; the NVRTC "
                              "log is above)", EXIT_USAGE) from exc


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.version_option(package_name="kernel-harness")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Correctness and performance regression harness for GPU kernels and collectives.

    Inside a repository with a project file (harness.toml, or [tool.harness] in
    pyproject.toml) its suites, golden directory, DB, world sizes and tier are the defaults.
    """
    ctx.obj = {"debug": debug}
    load_project(ctx)


# ------------------------------------------------------------------------------------ run
@cli.command()
@click.argument("selectors", nargs=-1)
@suite_option
@click.option("--tier", default="smoke", show_default=True,
              type=click.Choice(["smoke", "nightly", "stress"]), help="Parameter grid to run.")
@click.option("--world-sizes", default="1,4,8", show_default=True,
              help="Comma-separated MPI world sizes; one job per size.")
@click.option("--impl", "impls", multiple=True,
              help="Implementation, negative control or module:callable (repeatable; "
                   "default: every implementation).")
@click.option("--device", default="auto", show_default=True,
              type=click.Choice(["auto", "cpu", "cuda"]))
@click.option("--bench/--no-bench", default=None,
              help="Time the implementations that pass (default: fully where each rank has "
                   "its own CPUs and GPU, with a token budget where ranks contend, their times "
                   "marked ~ and kept out of the regression series). --bench times fully "
                   "everywhere and keeps every time in the series; --no-bench checks only.")
@click.option("--db", default=None, help="History DB (default $HARNESS_DB or "
                                         "harness-results/history.db).")
@click.option("--out-dir", default=None, type=click.Path(file_okay=False),
              help="Where run folders go (default: beside the DB, in runs/).")
@click.option("--timeout", type=float, default=None,
              help="Per-case deadline in seconds (default: each op's own).")
@click.option("--fail-on", default="failure", show_default=True,
              type=click.Choice(["failure", "regression", "never"]),
              help="Exit 1 on correctness failures; with 'regression' also exit 3 on a "
                   "confirmed performance regression; 'never' always exits 0.")
@click.option("--launcher", default=None, help="mpiexec, mpirun or srun (path or name).")
@click.option("--launcher-args", default="", help="Extra launcher arguments (quoted string).")
@click.option("--hostfile", default=None, type=click.Path(exists=True, dir_okay=False))
@click.option("--grace", type=float, default=30.0, show_default=True,
              help="Seconds past a case's deadline before the launcher kills a hung job.")
@click.option("--golden-dir", default=None, type=click.Path(file_okay=False),
              help="Golden directory (default $HARNESS_GOLDEN_DIR or suites/golden).")
@click.option("--golden/--no-golden", "use_golden", default=True, show_default=True,
              help="Also compare every implementation with the stored golden.")
@click.option("--timing-mode", default="events", show_default=True,
              type=click.Choice(["events", "graph"]),
              help="On CUDA: CUDA events around each call, or CUDA-graph replay of one call.")
@click.option("--l2-flush", is_flag=True,
              help="Overwrite a buffer of twice the last-level cache before every timed repeat.")
@click.option("--sanitize", is_flag=True,
              help="Run the ranks under compute-sanitizer's memcheck (CUDA): an illegal or "
                   "misaligned access is reported with its kernel (in the run folder's "
                   "wN.sanitizer.RANK.log files and the case's reason); checks only, no "
                   "timing.")
@click.option("--report", "report_dir", default=None, type=click.Path(file_okay=False),
              help="After the run, render the dashboard of the whole history into this "
                   "directory (as `harness report --out DIR`).")
@click.option("--resume", "resume_id", default=None, metavar="RUN_ID",
              help="Finish a run that was killed (its id, or the start of it): the cases it "
                   "recorded stay, the missing ones run with the run's own selection and "
                   "options, then it is stored and analysed once. --db or --out-dir say where "
                   "its folder is; --timeout, --fail-on, --launcher, --launcher-args, "
                   "--hostfile, --grace and --report may be given anew.")
@click.pass_context
def run(ctx: click.Context, resume_id: str | None, **params: Any) -> None:
    """Run, check and time the selected cases at each world size; record them in the DB.

    SELECTORS are families (collectives), ops (allreduce) or globs over case ids
    ('allreduce[*dtype=bf16*]'); none selects everything in the tier.
    """
    from harness.engine import resume

    if resume_id is None:
        # what --resume will run it with: the KEPT options, as JSON holds them
        kept = {name: list(params[name]) if isinstance(params[name], tuple) else params[name]
                for name in resume.KEPT}
        _run(ctx, resumed=None, kept=kept, **params)
        return
    from harness.core.discovery import use_suites
    from harness.device import envinfo
    from harness.history import store

    given = sorted(name for name in resume.KEPT
                   if ctx.get_parameter_source(name) not in (click.core.ParameterSource.DEFAULT,
                                                             click.core.ParameterSource.DEFAULT_MAP,
                                                             None))
    if given:
        flags = ", ".join("SELECTORS" if n == "selectors" else "--" + n.replace("_", "-")
                          for n in given)
        _fail(f"--resume finishes a run with the selection and options it was started with: "
              f"drop {flags}", EXIT_USAGE)
    db_path = store.resolve_db_path(params["db"])
    try:
        run_dir, info = resume.locate(store.runs_root(db_path, params["out_dir"]), resume_id)
        options = resume.options_of(info)
        resume.check_same_machine(info, envinfo.machine())
        resume.check_same_commit(info, envinfo.git_commit())
        stopped = resume.stop_leftovers(info.run_id)
    except resume.ResumeError as exc:
        _fail(str(exc), EXIT_USAGE)
    if stopped:
        err_console.print(f"stopped {len(stopped)} process(es) left running by run "
                          f"{info.run_id}", highlight=False)
    resume.cut_torn_line(run_dir / "results.jsonl")
    use_suites(options.pop("suite_sources", []), options.pop("suite_golden_dir", None))
    for name in resume.KEPT:
        params[name] = tuple(options[name]) if isinstance(options[name], list) else options[name]
    _run(ctx, resumed=(run_dir, info), kept=options, **params)


def _run(ctx: click.Context, resumed: tuple[Path, Any] | None, kept: dict[str, Any],
         selectors: tuple[str, ...],
         tier: str, world_sizes: str, impls: tuple[str, ...], device: str, bench: bool | None,
         db: str | None, out_dir: str | None, timeout: float | None, fail_on: str,
         launcher: str | None, launcher_args: str, hostfile: str | None, grace: float,
         golden_dir: str | None, use_golden: bool, timing_mode: str, l2_flush: bool,
         sanitize: bool, report_dir: str | None) -> None:
    """``run``'s body: a new run, or the ``resumed`` one's (run directory, RunInfo);
    ``kept``: the options a new run records for ``--resume`` (``resume.KEPT``)."""
    import shlex

    from harness.core.discovery import extra_suites
    from harness.core.results import RunInfo
    from harness.device import envinfo
    from harness.engine.launch import LaunchConfig, LauncherError, PlacementFailed, run_world_size
    from harness.history import store
    sizes = parse_world_sizes(world_sizes)
    if timeout is not None and timeout <= 0:
        _fail(f"--timeout {timeout} must be a positive number of seconds", EXIT_USAGE)
    specs, plans, resolved = resolve_plans(selectors, tier, sizes, impls, device)
    if not any(plans.values()):
        where = "; ".join(f"{s.name} runs at {s.world_sizes_of(tier)}" for s in specs[:4])
        more = f" (and {len(specs) - 4} more ops)" if len(specs) > 4 else ""
        _fail(f"the selection has no case in tier {tier!r} at world sizes {world_sizes}: "
              f"{where}{more}; try `harness list` to see what exists", EXIT_USAGE)
    note_shared_impls(specs, impls)
    if timing_mode == "graph" and resolved.type != "cuda":
        _fail("--timing-mode graph replays CUDA graphs and needs a GPU: drop it (CPU timing "
              "uses perf_counter) or run with --device cuda on a machine with one", EXIT_USAGE)
    sanitizer = None
    if sanitize:
        from harness.device import sanitizer as compute_sanitizer

        if resolved.type != "cuda":
            _fail("--sanitize checks CUDA kernels with compute-sanitizer and needs a GPU: run "
                  "with --device cuda on a machine with one", EXIT_USAGE)
        sanitizer = compute_sanitizer.find()
        if sanitizer is None:
            _fail("--sanitize needs compute-sanitizer (part of the CUDA toolkit): put its "
                  "bin directory on PATH or set CUDA_HOME", EXIT_USAGE)
        bench = False  # memcheck makes every kernel many times slower: no time means anything
    report_cmd = command_named(ctx, "report") if report_dir else None  # fail before running
    mpiexec = envinfo.find_launcher(launcher)
    if mpiexec is None:
        _fail(f"no MPI launcher found{f' ({launcher!r})' if launcher else ''}: "
              "`pip install mpich` (or install MPI), or pass --launcher PATH", EXIT_INFRA)
    if device != "cpu":  # what would break the GPU ranks, said before any starts
        from harness.device import bringup

        blockers = bringup.run_blockers(envinfo.site_facts(mpiexec, env={}, mpi=False),
                                        device, sizes)
        if blockers:
            _fail(f"{blockers[0]} (`harness env --check` lists every check)", EXIT_USAGE)

    db_path = store.resolve_db_path(db)
    if resumed is None:
        run_id = uuid.uuid4().hex
        run_dir = (store.runs_root(db_path, out_dir) / run_id).resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        env = envinfo.environment(mpiexec)
        options = {**kept, "suite_sources": list(extra_suites()[0]),
                   "suite_golden_dir": _str_or_none(extra_suites()[1])}
        info = RunInfo(run_id=run_id, started_at=time.time(), tier=tier, world_sizes=sizes,
                       machine=envinfo.machine(), env=env, selectors=list(selectors),
                       impls=list(impls), argv=sys.argv[1:], git_commit=env.get("git_commit"),
                       options=options)
    else:
        run_dir, info = resumed
        run_id, env = info.run_id, info.env
        info.status = "running"
    info.write(run_dir / "run.json")
    calibrations = _write_calibrations(db_path, info.machine["fingerprint"], run_dir)
    if calibrations is None and bench is not False:
        click.echo("note: this machine has no calibration: times are not checked against its "
                   "copy and matmul peaks (a time past them fails as impossible) and no % of "
                   "peak is shown; `harness calibrate` measures them once", err=True)
    cfg = LaunchConfig(launcher=mpiexec, run_dir=run_dir, run_id=run_id, tier=tier,
                       selectors=selectors, impls=impls, device=device,
                       bench=bench is not False, full_timing=bench is True,
                       timeout=timeout, env_id=envinfo.env_id(env),
                       launcher_args=shlex.split(launcher_args), hostfile=hostfile,
                       grace_s=grace, golden=use_golden, timing_mode=timing_mode,
                       l2_flush=l2_flush, calibrations=calibrations, sanitizer=sanitizer,
                       golden_dir=str(Path(golden_dir).resolve()) if golden_dir else None,
                       suites=extra_suites()[0], suite_golden_dir=_str_or_none(extra_suites()[1]))
    err_console.print(f"{'resuming run' if resumed else 'run'} {run_id}  tier={tier}  "
                      f"world sizes={sizes}  -> {run_dir}")
    if not impls and resumed is None:  # said once the run is sure to start
        from harness.core.spec import not_runnable

        left_out = not_runnable(specs, resolved.type)
        triton = [name for name, fn in left_out if getattr(fn, "triton", False)]
        cuda_cpp = [name for name, fn in left_out if not getattr(fn, "triton", False)]
        if cuda_cpp:
            err_console.print(f"not run on {resolved.type}: {escape(', '.join(cuda_cpp))} "
                              "(CUDA C++ implementations; they run with --device cuda on a "
                              "GPU machine)", highlight=False)
        if triton:
            err_console.print(f"not run on {resolved.type} unless asked for: "
                              f"{escape(', '.join(triton))} (Triton implementations: "
                              "--impl NAME runs them through Triton's interpreter here; a GPU "
                              "run compiles them)", highlight=False)

    infra_errors: list[str] = []
    placement_error = ""
    total = sum(len(p) for p in plans.values())
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=False) as progress:
        overall = progress.add_task("cases", total=total)
        base = 0
        for w in sizes:
            items = plans[w]
            if not items:
                continue
            task = progress.add_task(f"world size {w}", total=len(items))

            def update(n: int, task: Any = task, base: int = base) -> None:
                progress.update(task, completed=n)
                progress.update(overall, completed=base + n)

            try:
                outcome = run_world_size(cfg, w, items, update)
            except LauncherError as exc:
                infra_errors.append(str(exc))
                break
            except PlacementFailed as exc:
                placement_error = str(exc)
                break
            warning = (outcome.placement or {}).get("warning")
            if warning:
                progress.console.print(f"[yellow]world size {w}:[/yellow] {escape(warning)}",
                                       highlight=False)
            if outcome.infra_error:
                infra_errors.append(outcome.infra_error)
            base += len(items)

    info.finished_at = time.time()
    info.status = ("infra_error" if infra_errors else
                   "config_error" if placement_error else "complete")
    info.write(run_dir / "run.json")
    from harness.history import regress

    try:
        conn = store.connect(db_path)
        try:
            store.ingest_dir(conn, run_dir)
            results = store.results_for_run(conn, run_id)
            findings = regress.analyze_and_store(conn, run_id)
        finally:
            conn.close()
    except store.StoreError as exc:
        _fail(f"{exc} (the run's files are kept in {run_dir}; `harness ingest` them later)",
              EXIT_USAGE)
    print_results(results)
    print_findings(findings, run_id)
    expected = {i.key for p in plans.values() for i in p}
    missing = expected - {r.key for r in results}
    failing = [r for r in results if r.status in ("fail", "error", "timeout", "crash")]
    summarize(results, missing, info.finished_at - info.started_at, db_path, run_id)
    for msg in infra_errors:
        err_console.print(f"[red]infrastructure error:[/red] {escape(msg)}")
    if report_cmd is not None:
        try:  # the report's own exit (never: 0) must not replace the run's verdict
            ctx.invoke(report_cmd, db=str(db_path), out_dir=Path(report_dir), fail_on="never")
        except click.exceptions.Exit:
            pass
    if placement_error:  # after what ran before it is stored and shown
        _fail(f"{placement_error} (the ranks found no placement; nothing ran at this world "
              "size)", EXIT_USAGE)
    if infra_errors:
        ctx.exit(EXIT_INFRA)
    if failing and fail_on in ("failure", "regression"):
        ctx.exit(EXIT_FAIL)
    if fail_on == "regression" and any(f.kind == "regression" for f in findings):
        ctx.exit(EXIT_REGRESSION)
    ctx.exit(EXIT_OK)


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _write_calibrations(db_path: Path | str, fingerprint: str, run_dir: Path) -> str | None:
    """This machine's calibrations (``harness calibrate``) as a file the ranks read, so results
    carry percent of peak; None when the machine was never calibrated. A PostgreSQL DB is
    opened here in any case: one that cannot be reached fails the run before it starts."""
    from harness.history import store

    if isinstance(db_path, Path) and not db_path.exists():
        return None
    try:
        conn = store.connect(db_path)
        try:
            found = store.latest_calibrations(conn, fingerprint)
        finally:
            conn.close()
    except store.StoreError as exc:
        _fail(str(exc), EXIT_USAGE)
    if not found:
        return None
    path = run_dir / "calibrations.json"
    path.write_text(json.dumps(found, indent=1), encoding="utf-8")
    return str(path)


_FINDING_STYLE = {"regression": "red", "new_failure": "red", "suspicious": "yellow",
                  "drift": "yellow", "bits_changed": "yellow", "improvement": "green",
                  "fixed": "green"}


def print_findings(findings: Sequence[Any], run_id: str | None = None) -> None:
    """Changes against this machine's history: regressions first, one line each; then how to
    triage them (``run_id``: the run that found them all, for marking them at once)."""
    from harness.history.regress import KINDS, format_findings

    ordered = sorted(findings, key=lambda f: KINDS.index(f.kind) if f.kind in KINDS else 99)
    for f, line in zip(ordered, format_findings(ordered), strict=True):
        style = _FINDING_STYLE.get(f.kind, "white")
        head, _, rest = line.partition(" ")
        console.print(f"[{style}]{head}[/{style}] {escape(rest)}", soft_wrap=True)
    regressions = [f for f in ordered if f.kind == "regression"]
    if regressions:
        console.print(escape("a regression is reported once, by the run that confirmed it; "
                             "mark it with `harness triage ID acknowledged|expected|invalid|"
                             "fixed --note TEXT` (`harness triage` lists them)"), soft_wrap=True)
    series = len({f.key for f in regressions})
    if run_id is not None and series > 1:
        # a busy machine slows most series of a run together: one mark for the night
        console.print(escape(f"{series} series regressed in this run at once: if the "
                             "machine was busy, `harness triage --run "
                             f"{run_id} invalid --note TEXT` marks them all"),
                      soft_wrap=True)


def _fmt_bw(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _fmt_pct(derived: dict[str, float]) -> str:
    # of the calibrated matmul peak when the op counts flops, else of the copy bandwidth
    pct = derived.get("pct_peak_flops", derived.get("pct_peak_bw"))
    return "-" if pct is None else f"{pct:.1f}"


def _work_of(op: str, params: Any, world_size: int) -> Any:
    from harness.core.discovery import registry

    spec = registry().specs.get(op)
    return spec.work(params, world_size) if spec is not None and spec.work else None


def print_results(results: Sequence[Any]) -> None:
    """Collectives as nccl-tests prints them (one line per size, #wrong beside the bandwidth);
    everything else as a table, one row per case."""
    from harness.cli.nccl_table import format_blocks

    collective, others = [], []
    for r in results:
        (collective if r.family == "collectives" and "n" in r.params else others).append(r)
    if collective:
        click.echo(format_blocks(collective, _work_of))
    if others:
        _print_table(others)
    print_contention(results)
    print_interpreted(results)
    print_absent_goldens(results)
    print_uncaught_controls(results)
    bound = [r for r in results if (r.timing or {}).get("launch_bound")]
    if bound:
        console.print(f"* {len(bound)} time(s) launch-bound: the host took most of the interval "
                      "between the CUDA events to enqueue the call, so it measures the launch "
                      "set-up, not the kernel; --timing-mode graph times the kernel alone",
                      highlight=False)


def _print_table(others: Sequence[Any]) -> None:
    table = Table(title="results", show_lines=False, header_style="bold")
    for col, just in (("world", "right"), ("case", "left"), ("impl", "left"),
                      ("status", "left"), ("time us", "right"), ("GB/s", "right"),
                      ("TFLOP/s", "right"), ("% peak", "right"), ("peak MB", "right"),
                      ("#wrong", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    style = {"pass": "green", "fail": "red", "error": "red", "timeout": "magenta",
             "crash": "magenta", "skip": "yellow"}
    for r in others:
        median = (r.timing or {}).get("median")
        peak = "n/m" if r.peak_memory_bytes is None else f"{r.peak_memory_bytes / 1e6:.2f}"
        table.add_row(str(r.world_size), escape(r.case_id), escape(r.impl),
                      f"[{style.get(r.status, 'white')}]{r.status}[/]",
                      fmt_us(median) + r.time_marks,
                      _fmt_bw(r.derived.get("gbps")), _fmt_bw(r.derived.get("tflops")),
                      _fmt_pct(r.derived), peak,
                      str(r.wrong) if r.status in ("pass", "fail") else "-")
    console.print(table)


def print_uncaught_controls(results: Sequence[Any]) -> None:
    """A warning for each negative control that passed every case it ran: its bug is not
    caught by this selection (the cases, the tolerance or the world sizes miss it)."""
    from harness.core.discovery import registry

    specs = registry().specs
    ran: dict[tuple[str, str], set[str]] = {}
    for r in results:
        spec = specs.get(r.case_id.split("[")[0])
        if spec is not None and r.impl in spec.negative_controls:
            ran.setdefault((spec.name, r.impl), set()).add(r.status)
    for (op, impl), statuses in sorted(ran.items()):
        if statuses <= {"pass", "skip"} and "pass" in statuses:
            console.print(f"[yellow]warning[/yellow]: negative control {escape(op)}@"
                          f"{escape(impl)} passed every case it ran: this selection does not "
                          "catch its bug (another case, tier or world size may)",
                          highlight=False, soft_wrap=True)


def print_absent_goldens(results: Sequence[Any]) -> None:
    """A note when cases ran without a stored golden (checked against the reference only):
    a new case passes silently otherwise, and a later ``golden verify`` finds it missing."""
    absent = sorted({(r.world_size, r.case_id) for r in results
                     if (r.golden or {}).get("status") == "absent"})
    if not absent:
        return
    first = absent[0][1]
    console.print(f"note: {len(absent)} case(s) have no stored golden (checked against the "
                  f"reference only), e.g. w{absent[0][0]} {escape(first)}; store them with "
                  f"`harness golden generate` and the same selectors and world sizes",
                  highlight=False, soft_wrap=True)


def print_contention(results: Sequence[Any]) -> None:
    """The footnote of the ``~`` times: taken while ranks contended for CPUs or a GPU."""
    contended = [r for r in results if (r.timing or {}).get("contention")]
    if not contended:
        return
    why = "; ".join(sorted({f"world size {r.world_size}: {r.timing['contention']}"
                            for r in contended}))
    token = sum(1 for r in contended if r.timing.get("minimal"))
    if token:
        console.print(f"~ {token} time(s) taken while ranks contended ({why}): they measure "
                      "the contention, not the implementation, so each got a token budget "
                      "(still checked after the repeats) and stays out of the regression "
                      "series; --bench times them fully", highlight=False)
    if len(contended) > token:
        console.print(f"~ {len(contended) - token} time(s) taken fully (--bench) while ranks "
                      f"contended ({why}): compare them only with times taken the same way",
                      highlight=False)


def print_interpreted(results: Sequence[Any]) -> None:
    """The footnote of the ``i`` times: Triton kernels run by Triton's interpreter."""
    n = sum(1 for r in results if r.interpreter and r.timing)
    if n:
        console.print(f"i {n} time(s) of Triton kernels run by Triton's interpreter (a CPU "
                      "run): the results are checked as on a GPU, but the time is the "
                      "interpreter's, so each got a token budget and stays out of the "
                      "history's series", highlight=False)


def print_failure(r: Any) -> None:
    """One line for a failing result: ``FAIL w4 case@impl: the first line of its reason``."""
    reason = r.reason.splitlines()[0] if r.reason else ""
    console.print(f"[red]{r.status.upper()}[/red] "
                  + escape(f"w{r.world_size} {r.case_id}@{r.impl}: {reason}"), soft_wrap=True)


def summarize(results: Sequence[Any], missing: set[str], seconds: float, db_path: Path | str,
              run_id: str) -> None:
    """Counts, the failures with their reasons, and where the run was stored."""
    from harness.history import store

    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    for r in results:
        if r.status in ("fail", "error", "timeout", "crash"):
            print_failure(r)
        elif r.status == "skip":  # a case that cannot run here says why, never silently
            console.print("[yellow]SKIP[/yellow] "
                          + escape(f"w{r.world_size} {r.case_id}@{r.impl}: {r.reason}"))
    if missing:
        console.print(f"[yellow]{len(missing)} case(s) did not run[/yellow]: "
                      + escape(", ".join(sorted(missing)[:5]))
                      + (" ..." if len(missing) > 5 else ""))
    parts = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    console.print(f"{parts or 'no results'} in {seconds:.1f} s; run {run_id} stored in "
                  f"{store.db_label(db_path)}")


# ----------------------------------------------------------------------------------- list
@cli.command("list")
@click.argument("selectors", nargs=-1)
@suite_option
@click.option("--tier", default="smoke", show_default=True,
              type=click.Choice(["smoke", "nightly", "stress"]))
@click.option("--world-sizes", default="1,4,8", show_default=True)
@click.option("--impl", "impls", multiple=True)
@click.option("--device", default="auto", show_default=True,
              type=click.Choice(["auto", "cpu", "cuda"]),
              help="The device a run would use: CUDA C++ implementations need cuda.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_cmd(selectors: tuple[str, ...], tier: str, world_sizes: str, impls: tuple[str, ...],
             device: str, as_json: bool) -> None:
    """List the ops, implementations and cases a run would execute, and the suite each op
    comes from."""
    sizes = parse_world_sizes(world_sizes)
    from harness.core.discovery import registry

    specs, plans, _ = resolve_plans(selectors, tier, sizes, impls, device)
    reg = registry()
    if as_json:
        click.echo(json.dumps([{"world_size": w, "case_id": i.case.id, "impl": i.impl,
                                "op": i.case.spec.name, "family": i.case.spec.family,
                                "suite": reg.suite_of.get(i.case.spec.name),
                                "origin": reg.origin_of(i.case.spec.name)}
                               for w, items in plans.items() for i in items], indent=1))
        return
    table = Table(title=f"ops in tier {tier}", header_style="bold")
    for col in ("suite", "family", "op", "implementations", "negative controls", "cases",
                "world sizes"):
        table.add_column(col)
    external = {}  # outside suites, in table order
    for spec in sorted(specs, key=lambda s: (reg.suite_of.get(s.name) != BUILTIN_SUITE,
                                             reg.suite_of.get(s.name, ""), s.family, s.name)):
        ws = [w for w in sizes if spec.cases(tier, w)]
        suite = reg.suite_for(spec.name)
        if suite is not None and suite.name != BUILTIN_SUITE:
            external[suite.name] = suite
        table.add_row(suite.name if suite else "-", spec.family, spec.name,
                      ", ".join(spec.implementations),
                      ", ".join(spec.negative_controls), str(len(spec.grid.get(tier, ()))),
                      ",".join(map(str, ws)))
    console.print(table)
    for suite in external.values():  # where each outside suite came from
        console.print(f"suite {escape(suite.name)}: {escape(suite.origin)}; goldens in "
                      f"{suite.golden_dir}", soft_wrap=True)
    for w, items in plans.items():
        console.print(f"world size {w}: {len(items)} items")
        for case_id in dict.fromkeys(i.case.id for i in items):
            console.print(f"  {escape(case_id)}", soft_wrap=True)


# ------------------------------------------------------------------------------------ env
@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--launcher", default=None, help="mpiexec to report on.")
@click.option("--check", is_flag=True,
              help="Print the GPU bring-up checklist only; exit 2 on a blocker.")
@click.pass_context
def env(ctx: click.Context, as_json: bool, launcher: str | None, check: bool) -> None:
    """Report torch, CUDA devices, MPI library and launcher, NCCL and NVRTC, then the bring-up
    checklist: a verdict per line (ok, note, warn, blocker) with the remedy. CUDA is queried
    through the driver (cuda-python), never initialised by torch unless cuda-python cannot use
    the driver. Exit 2 when --check finds a blocker."""
    from harness.device import bringup, envinfo

    mpiexec = envinfo.find_launcher(launcher)
    data = {"machine": envinfo.machine(), **envinfo.environment(mpiexec)}
    checks = bringup.checklist(envinfo.site_facts(mpiexec, env=data))
    blocked = bringup.worst(checks) == "blocker"
    if as_json:
        data["checks"] = [{"name": c.name, "level": c.level, "detail": c.detail}
                          for c in checks]
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        if not check:
            _print_environment(data)
            console.print("[bold]bring-up checks[/bold]")
        style = {"ok": "green", "note": "cyan", "warn": "yellow", "blocker": "red"}
        for c in checks:
            console.print(f"[{style[c.level]}]{c.level.upper():7}[/] "
                          + escape(f"{c.name}: {c.detail}"), soft_wrap=True)
    if check and blocked:
        ctx.exit(EXIT_USAGE)


def _print_environment(data: dict[str, Any]) -> None:
    table = Table(show_header=False, box=None)
    for key, value in data.items():
        if key == "cuda_devices":
            value = "; ".join(f"{d['index']}: {d['name']} sm_{d['capability'].replace('.', '')} "
                              f"{d['memory_bytes'] / 2**30:.0f} GiB, {d['uuid']}, compute mode "
                              f"{d['compute_mode']}" for d in value) or "none"
        elif key == "machine":
            value = (f"{value['name']} ({value['cpu_model']}, {value['cpu_count']} CPUs, "
                     f"{value['memory_gb']} GB; fingerprint {value['fingerprint']})")
        table.add_row(f"[bold]{key}[/bold]", escape("-" if value in (None, "") else str(value)))
    console.print(table)


# ----------------------------------------------------------- commands of their own modules
#: entry-point group of commands from other packages (the dashboard's `report` and `demo`):
#: found, not imported, so that imports keep pointing down
COMMANDS_GROUP = "harness.commands"
#: commands of that group that failed to load: named when someone calls them
_broken_commands: dict[str, str] = {}


def _register_commands() -> None:
    # each module defines plain click commands and imports only cli_common, never this module
    import importlib.metadata

    from harness.cli.calibrate import calibrate
    from harness.cli.changes import detect, triage
    from harness.cli.compare import compare
    from harness.cli.exchange import export, ingest
    from harness.cli.golden import golden
    from harness.cli.new_op import new_op
    from harness.cli.tolerance import tolerance

    for command in (golden, calibrate, compare, triage, detect, ingest, export, tolerance,
                    new_op):
        cli.add_command(command)
    for ep in importlib.metadata.entry_points(group=COMMANDS_GROUP):
        try:
            command = ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the CLI
            _broken_commands[ep.name] = f"{ep.value}: {type(exc).__name__}: {exc}"
            continue
        if isinstance(command, click.Command):
            cli.add_command(command, ep.name)


_register_commands()


def command_named(ctx: click.Context, name: str) -> click.Command:
    """A registered subcommand (``report`` for ``run --report``); exit 2 when it is missing."""
    command = cli.get_command(ctx, name)
    if command is None:
        why = _broken_commands.get(name)
        raise HarnessExit(
            f"the `{name}` command failed to load ({why}): reinstall kernel-harness"
            if why else f"no `{name}` command is installed: `pip install -e .` in the "
            "kernel-harness checkout registers it", EXIT_USAGE)
    return command


class Terminated(BaseException):
    """SIGTERM, raised in the main thread: on the way out whatever harness started is
    stopped (a run's MPI job) and what it wrote stays (a run's results.jsonl)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM raises Terminated while harness runs, and the handler before it is back after:
    a process that calls ``main`` (a test, a script) stays stoppable by SIGTERM once it
    returned. Only the main thread may set a handler (``signal.signal`` raises ValueError in
    any other); called from another thread, SIGTERM keeps its handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        # None: a handler not installed from Python; the default is the nearest to it
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: run click, turning user errors into one line and an exit code."""
    with _sigterm_raises():
        _main(argv)


def _main(argv: Sequence[str] | None) -> None:
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        # without standalone mode click returns ctx.exit()'s code instead of exiting
        code = cli.main(args=list(argv) if argv is not None else None, standalone_mode=False)
    except HarnessExit as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        sys.exit(exc.code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_USAGE)
    except click.exceptions.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except Terminated:
        err_console.print("terminated (SIGTERM); a run's results so far are in its run "
                          "directory's results.jsonl (`harness ingest RUN_DIR` stores them)")
        sys.exit(143)
    except Exception as exc:  # noqa: BLE001 - last resort: one line unless --debug
        if debug:
            raise
        from harness.core.results import ResultsError
        from harness.core.spec import SpecError
        from harness.history.sql import StoreError

        code = EXIT_USAGE if isinstance(exc, (StoreError, ResultsError, SpecError)) \
            else EXIT_INFRA
        err_console.print(f"[red]error:[/red] {escape(f'{type(exc).__name__}: {exc}')} "
                          "(rerun with --debug for the traceback)", soft_wrap=True)
        sys.exit(code)
    sys.exit(code if isinstance(code, int) else EXIT_OK)
