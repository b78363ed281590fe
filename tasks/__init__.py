"""Prefect tasks: one per stage, each a thin wrapper over closedloop.stages (no logic here)."""
