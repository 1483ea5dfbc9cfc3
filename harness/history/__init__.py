"""The run history: the history DB (SQLite or PostgreSQL: its schema, connection, ingest,
reads, and the findings and change points each run's analysis stores with their triage), the
change point analysis of a series, the regression analysis of a run against its history and
against one other run, and runs exchanged with other tools. It may import its own modules,
``harness.core`` and ``harness.device``."""
