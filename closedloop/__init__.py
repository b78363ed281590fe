"""closedloop: the post-training data closed loop for language models.

The package root stays import-light: heavy libraries (torch, transformers, mlflow, great_expectations,
prefect, dvc) are imported inside the functions that need them.
"""

__version__ = "0.1.0"
