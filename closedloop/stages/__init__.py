"""One module per DVC stage: read inputs → call the core → write outputs and metrics. The runner and
the stage context are in common.py; this file holds no code, so it is no stage's code dependency."""
