"""Agreement between human and automatic verdicts: Cohen's kappa and the confusion counts. Pure."""

from __future__ import annotations

from typing import Iterable


def cohen_kappa(a: list[bool], b: list[bool]) -> float | None:
    """Cohen's kappa of two raters' pass/fail verdicts on the same items (equals scikit-learn's
    ``cohen_kappa_score`` wherever that is defined).

    None when it is undefined: no items, or both raters gave every item one and the same verdict.
    Then chance agreement is 1 and kappa is 0/0 (scikit-learn returns nan with a warning); a number
    there would claim an agreement the data cannot show, so callers log "not enough variety" instead.
    """
    if len(a) != len(b):
        raise ValueError(f"cohen_kappa: the raters judged different numbers of items ({len(a)} vs {len(b)})")
    n = len(a)
    if n == 0:
        return None
    observed = sum(x == y for x, y in zip(a, b)) / n
    pa, pb = sum(map(bool, a)) / n, sum(map(bool, b)) / n
    chance = pa * pb + (1 - pa) * (1 - pb)
    if chance >= 1.0:
        return None
    return (observed - chance) / (1 - chance)


def agreement(pairs: Iterable[tuple[bool, bool]]) -> dict:
    """``pairs``: (human says pass, verifier says pass) per reviewed sample."""
    pairs = [(bool(human), bool(verifier)) for human, verifier in pairs]
    confusion = {
        "both_pass": sum(h and v for h, v in pairs),
        "human_only": sum(h and not v for h, v in pairs),
        "verifier_only": sum(v and not h for h, v in pairs),
        "both_fail": sum(not h and not v for h, v in pairs),
    }
    kappa = cohen_kappa([h for h, _ in pairs], [v for _, v in pairs])
    return {"kappa": kappa, "n": len(pairs), "confusion": confusion}
