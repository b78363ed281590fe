"""Benchmark runs, regression statistics and the promotion gate."""
