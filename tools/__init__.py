"""Maintainer tools: generators of doc tables (reliability_table), mutation testing (mutation), and the GPU
validation under tools/gpu/. Run from the repository root: `python -m tools.NAME [--help]`."""
