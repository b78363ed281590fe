"""Reward components and their combination into one scalar by the weights in params.yaml."""
