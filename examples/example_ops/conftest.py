# Puts this directory on sys.path (pytest's rootdir conftest), so that the tests import
# example_ops without installing it.
