"""The command line: the ``harness`` command (``harness.cli.main``) and its subcommands, their
shared options, errors and printing, the scaffold of a new op and the NCCL-style results table.
It may import its own modules and every layer below it: ``harness.engine``, ``harness.history``,
``harness.core`` and ``harness.device``."""
