"""The ``harness`` command line.

Exit codes: 0 all passed; 1 a correctness failure (fail, error, timeout, crash); 2 bad usage or
configuration; 4 the infrastructure failed (no MPI launcher, a job that keeps dying before it
runs a case). Errors a user can cause print one line naming the problem and the remedy; pass
``--debug`` for the traceback.
"""

from __future__ import annotations

import contextlib
import errno
import json
import shlex
import signal
import sys
import threading
import traceback
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
    printable,
    suite_option,
)
from harness.cli.show import print_outcome
from harness.core.discovery import BUILTIN_SUITE
from harness.engine.giveup import GIVE_UP_AFTER
from harness.engine.joblog import MAX_OUTPUT_MIB
from harness.engine.stall import STALL_TIMEOUT_S


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
              callback=lambda ctx, param, value: tuple(parse_world_sizes(value)),
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
                   "confirmed performance regression; 'never' exits 0 whatever the "
                   "results (an infrastructure or usage error still exits 4 or 2).")
@click.option("--launcher", default=None, help="mpiexec, mpirun or srun (path or name).")
@click.option("--launcher-args", default="", help="Extra launcher arguments (quoted string).",
              callback=lambda ctx, param, value: _launcher_args(value))
@click.option("--hostfile", default=None, type=click.Path(exists=True, dir_okay=False))
@click.option("--grace", type=float, default=30.0, show_default=True,
              help="Seconds past a case's deadline before the launcher kills a hung job.")
@click.option("--give-up-after", type=click.IntRange(min=0), default=GIVE_UP_AFTER,
              show_default=True,
              help="After this many cases in a row of one implementation at one world size "
                   "that ended their job (timed out: a likely deadlock; crashed; left its "
                   "process unusable), or twice as many in all, skip its remaining cases "
                   "there, saying why; 0 runs every case.")
@click.option("--stall-timeout", type=click.FloatRange(min=0), default=STALL_TIMEOUT_S,
              show_default=True,
              help="Seconds a job's ranks may be up with no case in progress (starting, "
                   "between cases, ending) before it is stopped as stuck: one stuck before "
                   "its first case is tried once more, then the world size is an "
                   "infrastructure error; 0 never stops one.")
@click.option("--max-output-mib", type=click.IntRange(min=0), default=MAX_OUTPUT_MIB,
              show_default=True,
              help="MiB of output a job's ranks may write to its log (an implementation "
                   "printing in every call) before the job is stopped: the case in progress "
                   "is a crash, the log keeps its start and end, the remaining cases run in "
                   "a new job; 0 never stops one.")
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
                   "timing; each case gets ten times its op's deadline unless --timeout.")
@click.option("--report", "report_dir", default=None, type=click.Path(file_okay=False),
              help="After the run, render the dashboard of the whole history into this "
                   "directory (as `harness report --out DIR`).")
@click.option("--resume", "resume_id", default=None, metavar="RUN_ID",
              help="Finish a run that was killed (its id, or the start of it): the cases it "
                   "recorded stay, the missing ones run with the run's own selection and "
                   "options, then it is stored and analysed once. --db or --out-dir say where "
                   "its folder is; --timeout, --fail-on, --launcher, --launcher-args, "
                   "--hostfile, --grace, --give-up-after, --stall-timeout, --max-output-mib "
                   "and --report are the run's own unless given anew.")
@click.pass_context
def run(ctx: click.Context, resume_id: str | None, **params: Any) -> None:
    """Run, check and time the selected cases at each world size; record them in the DB.

    SELECTORS are families (collectives), ops (allreduce) or globs over case ids
    ('allreduce[*dtype=bf16*]'); none selects everything in the tier.
    """
    from harness.core.discovery import extra_suites
    from harness.engine import resume, session
    from harness.engine.options import RunOptions

    sources, golden_dir, _ = extra_suites()
    options = RunOptions.from_mapping({**params, "suite_sources": sources, "suite_golden_dir":
                                       None if golden_dir is None else str(golden_dir)})
    resumed = None
    if resume_id is not None:
        given = [n for n in RunOptions.kept_names() if n in params and _given(ctx, n)]
        if given:
            flags = ", ".join("SELECTORS" if n == "selectors" else "--impl" if n == "impls"
                              else "--" + n.replace("_", "-") for n in given)
            _fail(f"--resume finishes a run with the selection and options it was started "
                  f"with: drop {flags}", EXIT_USAGE)
        try:
            # the run's own launcher, timeout, grace... unless given anew
            anew = [n for n in params if _given(ctx, n)]
            run_dir, info, options, stopped = resume.prepare(options, resume_id, anew)
        except resume.ResumeError as exc:
            _fail(str(exc), EXIT_USAGE)
        if stopped:
            err_console.print(f"stopped {len(stopped)} process(es) left running by run "
                              f"{info.run_id}", highlight=False)
        resumed = (run_dir, info)
    report_cmd = command_named(ctx, "report") if options.report_dir else None  # fail early
    if options.report_dir:
        try:  # before the run, not after an hour of it
            Path(options.report_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            _fail(f"cannot make the --report folder {options.report_dir} "
                  f"({exc.strerror or exc}): pass another --report", EXIT_USAGE)
    try:
        with ProgressReporter() as reporter:
            outcome = session.execute(options, reporter, resumed)
    except session.RunRefused as exc:
        if exc.detail:
            err_console.print(escape(exc.detail), highlight=False)
        _fail(str(exc), EXIT_INFRA if exc.infra else EXIT_USAGE)
    print_outcome(outcome)
    for msg in outcome.infra_errors:
        err_console.print(f"[red]infrastructure error:[/red] {escape(msg)}", soft_wrap=True)
    report_failed = None
    if report_cmd is not None:
        try:  # the report's own exit (never: 0) must not replace the run's verdict
            ctx.invoke(report_cmd, db=str(outcome.db_path), out_dir=Path(options.report_dir),
                       fail_on="never")
        except click.exceptions.Exit:
            pass
        except HarnessExit as exc:  # nor its error: said, and the run's failure comes first
            err_console.print(f"error: the dashboard was not made: {escape(str(exc))}",
                              soft_wrap=True, highlight=False)
            report_failed = exc.code
    if outcome.placement_error:  # after what ran before it is stored and shown
        _fail(f"{outcome.placement_error} (the ranks found no placement; nothing ran at this "
              "world size)", EXIT_USAGE)
    ctx.exit(exit_code(outcome, options.fail_on) or report_failed or EXIT_OK)


def _launcher_args(text: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise HarnessExit(f"--launcher-args {text!r} cannot be split as a shell would "
                          f"({exc}): quote it as you would on a command line", EXIT_USAGE) from exc


#: OSErrors of a path given that cannot be written (a read-only place, a file where a folder
#: must be, a name too long): the user's input, exit 2
_PATH_ERRORS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR,
                errno.ENAMETOOLONG, errno.EEXIST)


def exit_code(outcome: Any, fail_on: str) -> int:
    """A finished run's exit code (the module docstring's table)."""
    if outcome.infra_errors:
        return EXIT_INFRA
    if outcome.failing and fail_on in ("failure", "regression"):
        return EXIT_FAIL
    if fail_on == "regression" and any(f.kind == "regression" for f in outcome.findings):
        return EXIT_REGRESSION
    return EXIT_OK


def _given(ctx: click.Context, name: str) -> bool:
    """Whether the user gave parameter ``name`` (not its default, nor the project file's)."""
    source = ctx.get_parameter_source(name)
    return source not in (click.core.ParameterSource.DEFAULT,
                          click.core.ParameterSource.DEFAULT_MAP, None)


class ProgressReporter:
    """A run's progress on stderr: a bar per world size and one for all the cases."""

    def __enter__(self) -> ProgressReporter:
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=err_console, transient=False)
        self.overall: Any = None
        self.base = self.cases = 0
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.overall is not None:
            self.progress.stop()

    def note(self, text: str) -> None:
        err_console.print(escape(text), highlight=False, soft_wrap=True)

    def started(self, info: Any, run_dir: Path, resumed: bool, cases: int) -> None:
        global _running
        self.cases = cases
        _running = (info.run_id, run_dir)
        err_console.print(f"{'resuming run' if resumed else 'run'} {info.run_id}  "
                          f"tier={info.tier}  world sizes={info.world_sizes}  -> {run_dir}",
                          highlight=False, soft_wrap=True)

    def world(self, world_size: int, cases: int) -> Any:
        if self.overall is None:
            self.progress.start()
            self.overall = self.progress.add_task("cases", total=self.cases)
        task = self.progress.add_task(f"world size {world_size}", total=cases)
        base = self.base
        self.base += cases

        def update(n: int) -> None:
            self.progress.update(task, completed=n)
            self.progress.update(self.overall, completed=base + n)

        return update

    def warning(self, world_size: int, text: str) -> None:
        self.progress.console.print(f"[yellow]world size {world_size}:[/yellow] {escape(text)}",
                                    highlight=False, soft_wrap=True)


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
    from harness.engine import session

    try:
        the_plan = session.plan(selectors, tier, sizes, impls, device)
    except session.RunRefused as exc:
        if exc.detail:
            err_console.print(escape(exc.detail), highlight=False)
        raise HarnessExit(str(exc), EXIT_USAGE) from exc
    empty = session.nothing_to_run(the_plan, tier, sizes)
    if empty:
        raise HarnessExit(f"{empty}; try other --world-sizes, --tier or --impl",
                          EXIT_USAGE)
    specs, plans = the_plan.specs, the_plan.items
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
@click.option("--clean-shm", is_flag=True,
              help="Remove your MPI and NCCL segments in /dev/shm that no process holds "
                   "(left by killed jobs), then report.")
@click.pass_context
def env(ctx: click.Context, as_json: bool, launcher: str | None, check: bool,
        clean_shm: bool) -> None:
    """Report torch, CUDA devices, MPI library and launcher, NCCL and NVRTC, then the bring-up
    checklist: a verdict per line (ok, note, warn, blocker) with the remedy. CUDA is queried
    through the driver (cuda-python), never initialised by torch unless cuda-python cannot use
    the driver. Exit 2 when --check finds a blocker."""
    from harness.device import bringup, envinfo

    if clean_shm:
        from harness.device import shm

        removed = shm.remove_unheld(shm.segments())
        click.echo(f"removed {len(removed)} MPI/NCCL shared-memory file(s) no process held "
                   f"({sum(size for _, size in removed) / 2**20:.1f} MiB) from {shm.SHM_DIR}",
                   err=True)
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
        # printable: HARNESS_MACHINE and paths are the user's text (an escape would recolour)
        table.add_row(f"[bold]{key}[/bold]",
                      escape(printable("-" if value in (None, "") else str(value))))
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


#: the run `harness run` is making (id, folder): a stopped run's last line says how to finish it
_running: tuple[str, Path] | None = None


def stopped_line(how: str) -> str:
    """What a user reads when harness is stopped by ``how`` (SIGINT, SIGTERM): where the
    results so far are and the command that finishes the run."""
    if _running is None:
        return f"stopped ({how})"
    run_id, run_dir = _running
    return (f"stopped ({how}): the MPI job is stopped and the cases recorded so far stay in "
            f"{run_dir}/results.jsonl; `harness run --resume {run_id}` (with the same --db or "
            "--out-dir) runs the rest and stores the run")


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
    global _running
    _running = None
    with _sigterm_raises():
        _main(argv)


def _main(argv: Sequence[str] | None) -> None:
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        # without standalone mode click returns ctx.exit()'s code instead of exiting
        code = cli.main(args=list(argv) if argv is not None else None, standalone_mode=False)
    except HarnessExit as exc:
        if debug and (exc.__cause__ or exc.__context__):  # what the one line stands for
            traceback.print_exception(exc.__cause__ or exc.__context__)
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        sys.exit(exc.code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_USAGE)
    except (click.exceptions.Abort, KeyboardInterrupt):  # Ctrl-C (click makes it Abort)
        err_console.print(escape(stopped_line("SIGINT")), highlight=False, soft_wrap=True)
        sys.exit(130)
    except Terminated:
        err_console.print(escape(stopped_line("SIGTERM")), highlight=False, soft_wrap=True)
        sys.exit(143)
    except Exception as exc:  # noqa: BLE001 - last resort: one line unless --debug
        if debug:
            raise
        from harness.core.results import ResultsError
        from harness.core.spec import SpecError
        from harness.history.sql import StoreError, Unavailable, translate_any

        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            where = f" holding {exc.filename}" if exc.filename else ""
            rest = (f"; `harness run --resume {_running[0]}` then finishes the run"
                    if _running else "")
            err_console.print(f"[red]error:[/red] the disk{escape(where)} is full "
                              f"({escape(exc.strerror or '')}): free space and retry{rest}",
                              soft_wrap=True)
            sys.exit(EXIT_INFRA)
        from harness.device.shadowed import shadowed
        from harness.engine.options import RunFolderError

        shadow = shadowed() if isinstance(exc, (ImportError, AttributeError)) else ""
        if shadow:  # what failed is the user's file importing as a needed package
            err_console.print(f"[red]error:[/red] {escape(shadow)} "
                              f"({escape(f'{type(exc).__name__}: {exc}')})", soft_wrap=True)
            sys.exit(EXIT_USAGE)
        if isinstance(exc, RunFolderError):  # where the user's path points (under /proc)
            err_console.print(f"[red]error:[/red] cannot use {escape(str(exc.filename))} "
                              f"({escape(exc.strerror or str(exc))}): pass a path that "
                              "exists or can be made", soft_wrap=True)
            sys.exit(EXIT_USAGE)
        if isinstance(exc, OSError) and exc.errno in _PATH_ERRORS:
            # a path the user gave that cannot be written: theirs to change
            where = f" {exc.filename}" if exc.filename else ""
            err_console.print(f"[red]error:[/red] cannot write{escape(where)} "
                              f"({escape(exc.strerror or str(exc))}): pass a path you can "
                              "write to", soft_wrap=True)
            sys.exit(EXIT_USAGE)
        found = translate_any(exc) or exc
        code = EXIT_USAGE if isinstance(found, (StoreError, ResultsError, SpecError)) \
            and not isinstance(found, Unavailable) else EXIT_INFRA
        if isinstance(found, StoreError):
            err_console.print(f"[red]error:[/red] {escape(str(found))}", soft_wrap=True)
            sys.exit(code)
        err_console.print(f"[red]error:[/red] {escape(f'{type(exc).__name__}: {exc}')} "
                          "(rerun with --debug for the traceback)", soft_wrap=True)
        sys.exit(code)
    sys.exit(code if isinstance(code, int) else EXIT_OK)
