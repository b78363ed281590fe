"""Adapters that version and trace the loop: DVC (data), MLflow (runs, models), GX (batch checks)."""
