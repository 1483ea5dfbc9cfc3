"""Pure reference math, one module per family. Imports torch only; nothing of the harness."""
