"""Serving: vLLM for the compact extractor, and the HTTP memory service over the runtime."""
