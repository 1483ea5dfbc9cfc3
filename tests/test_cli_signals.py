"""``harness.cli.main`` called in a process of someone else's (a test, a script, a thread).

SIGTERM raises inside harness so that a run stops its MPI job on the way out
(tests/test_stopping_a_run.py); once ``main`` is done, the process's own SIGTERM handler is
back, or a caller that ran harness once could no longer be stopped by SIGTERM (pytest caught
the exception as a test's failure and ran on). Only the main thread may set a handler.
"""

from __future__ import annotations

import signal
import threading

import pytest

from harness.cli import main as cli


def _run(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    return info.value.code


def test_main_gives_back_the_sigterm_handler_it_found(capsys):
    seen: list[int] = []

    def mine(signum, frame):
        seen.append(signum)

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        assert _run(["--version"]) == 0
        assert signal.getsignal(signal.SIGTERM) is mine
        signal.raise_signal(signal.SIGTERM)
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_sigterm_inside_main_is_exit_143(monkeypatch, capsys):
    def stopped(*args, **kwargs):
        signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(cli.cli, "main", stopped)
    previous = signal.getsignal(signal.SIGTERM)
    assert _run(["list"]) == 143
    assert "stopped (SIGTERM)" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is previous


def test_main_runs_off_the_main_thread(capsys):
    codes: list[object] = []

    def target():
        try:
            cli.main(["--version"])
        except SystemExit as exc:
            codes.append(exc.code)
        except BaseException as exc:  # noqa: BLE001 - what the thread died of, for the assert
            codes.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(30)
    assert codes == [0]


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stopped_run_says_where_its_results_are_and_how_to_finish_it(monkeypatch, capsys,
                                                                       tmp_path, sig, code):
    def started_then_stopped(*args, **kwargs):
        class Info:
            run_id, tier, world_sizes = "0123abcd" * 4, "smoke", [2]

        cli.ProgressReporter().started(Info(), tmp_path / "runs" / Info.run_id, False, 3)
        if sig == signal.SIGINT:  # what Python's own SIGINT handler raises; a shell that
            raise KeyboardInterrupt  # started pytest in the background set SIGINT ignored
        signal.raise_signal(sig)

    monkeypatch.setattr(cli.cli, "main", started_then_stopped)
    assert _run(["run"]) == code
    line = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()][-1]
    assert line.startswith(f"stopped ({sig.name})")  # before: "aborted" and nothing more
    assert f"harness run --resume {'0123abcd' * 4}" in line and "results.jsonl" in line
