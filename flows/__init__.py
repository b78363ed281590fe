"""Prefect flows: one iteration, the loop of N iterations, and the served deployments."""
