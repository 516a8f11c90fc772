"""Benchmarks a user runs, from the repository root: `python -m bench.NAME [--help]`.

Each prints its figures (most as JSON); docs/BENCHMARKS.md has the results with the command behind each.
"""
