"""Serving: the HTTP memory service over the runtime."""
