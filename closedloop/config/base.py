"""What every section of params.yaml is: a pydantic model that refuses unknown keys and checks each
assignment, so a typo never silently falls back to a default."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

PARAMS_FILE = "params.yaml"


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
