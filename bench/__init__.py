"""The purgatory_aio benchmark suite: the workloads described in ``docs/benchmarks.md``.

Every workload measures the library and its comparison in the same process run,
driven by one schedule generated from a seed, on the standard asyncio loop and
on uvloop, and writes a JSON record under ``bench/results/``. Run it with
``python -m bench --help``.
"""
