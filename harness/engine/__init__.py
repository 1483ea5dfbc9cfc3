"""Running cases: a run's settings record and the layout of its run directory (``options``), a
run from start to end (``session``: plan, preflight, launch, ingest, analyse), one case of one
implementation on every rank (its inputs and reference, the checked calls, the timing and the
verdict all ranks agree on), the watchdog, MPI jobs launched per world size (and stopped
when stuck outside any case), a killed run resumed, cases run in this process, a machine's
calibrated peaks, and how much of each tolerance an implementation uses. It may import its
own modules, ``harness.history``, ``harness.core`` and ``harness.device``."""
