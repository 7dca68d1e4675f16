"""Experiments on Flower's simulation engine: local runs, benchmarks (sweeps and reports to come)."""
