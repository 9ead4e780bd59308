"""Benchmarks of the stages and the runtime, run from a checkout (`python -m benchmarks.NAME`, the Makefile's
`bench-*` targets; results in BENCHMARKS.md). Not installed: no product package imports them."""
