"""Where shards run: this machine (``local``) or a Ray cluster (``ray``), behind one interface.

A stage hands the executor plain records (tasks, samples, completions as dicts and lists) and the
dotted name of the worker class that handles them; it gets plain records back, in shard order. No
stage branches on the backend's name: ``open_executor(params)`` picks it from ``execution.backend``.
"""
