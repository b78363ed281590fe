"""Stage promote: the model the next iteration starts from — the candidate if the gate said so.

Writing it as a stage output (not over data/champion) keeps dvc.yaml acyclic: the loop closes when
the next iteration takes this output as its champion input. ``replace_dir`` hard-links the chosen
model's files (read-only links to DVC's cache objects) into a new folder and renames it into place:
promotion writes no weights, and never into a file another version shares.
"""

from __future__ import annotations

from closedloop.io import read_json, replace_dir
from closedloop.models.loading import model_fingerprint
from closedloop.stages.common import StageContext


def run(ctx: StageContext) -> dict:
    decision = read_json(ctx.ws.gate)
    source = ctx.ws.candidate if decision["promote"] else ctx.ws.champion
    replace_dir(source, ctx.ws.next_champion)
    return {"promoted": bool(decision["promote"]), "model_version": model_fingerprint(ctx.ws.next_champion)}
