"""Evaluation: retrieval benchmarks of the memory runtime (extraction and QA metrics to come)."""
