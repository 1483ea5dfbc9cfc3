"""Greedy sampling over a vocabulary sharded across tensor-parallel ranks."""
