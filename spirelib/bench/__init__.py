"""Benchmarks: `python -m spirelib.bench NAME [options]`, one module per NAME."""
