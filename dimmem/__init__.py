"""DimMem: atomic, typed memory records with explicit dimensions, and the pipeline around a compact extractor."""

__version__ = "0.1.0"
