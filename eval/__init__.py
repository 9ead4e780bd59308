"""Evaluation: extraction quality against reference labels, end-to-end memory QA (LoCoMo, LongMemEval),
LLM-free retrieval benchmarks, and the runtime's speed benchmark."""
