"""Exact parameter, FLOP and memory accounting from a model config: arithmetic only, no torch."""
