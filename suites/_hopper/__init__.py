"""The hopper_tasks family, by kind of task; suites/hopper_tasks.py gathers their specs."""
