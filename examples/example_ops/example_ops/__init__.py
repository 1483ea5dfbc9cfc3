"""Example op suite: each op is a subpackage with its reference, spec, implementation and
negative controls; kernel-harness finds every ``SPECS`` inside this package."""
