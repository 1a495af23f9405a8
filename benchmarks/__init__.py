"""Benchmarks: each `bench_*.py` module has `run() -> list[Row]`; `make bench` runs them all."""
