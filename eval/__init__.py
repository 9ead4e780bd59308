"""Evaluation: extraction quality against reference labels, end-to-end memory QA (LoCoMo, LongMemEval),
and LLM-free retrieval benchmarks."""
