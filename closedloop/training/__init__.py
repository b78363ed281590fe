"""Training of policy models."""
