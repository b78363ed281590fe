"""An iteration's bookkeeping, between the flows and the adapters: begin or resume it (resume.py), close
the loop (loop.py), merge and record reviews (reviews.py), record and register it (register.py), record
a failure (failures.py). The flows call these; they call lineage/'s DVC, MLflow and git adapters."""
