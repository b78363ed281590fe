"""closedloop: the post-training data closed loop for language models. (Its version is pyproject.toml's:
``importlib.metadata.version("closedloop")``.)

The package root stays import-light: heavy libraries (torch, transformers, mlflow, great_expectations,
prefect, dvc) are imported inside the functions that need them.
"""
