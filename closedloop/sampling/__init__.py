"""Policy sampling backends."""
