"""Which examples make each batch, and how a batch becomes tensors: padded, or packed several to a row.

Batches are a pure function of the seed (a resumed run draws the very batches an uninterrupted one
would); packing is deterministic too, so a batch always becomes the same tensors.
"""

from __future__ import annotations

import random
from typing import Any

IGNORE_INDEX = -100  # the label value transformers' causal-LM loss skips
GROUP_WINDOW = 8  # batches whose long examples are grouped together (see batch_indices)
LONG_FACTOR = 1.5  # "long" means longer than this times the median example

Row = tuple[list[int], list[int]]  # (input_ids, labels) of one example


def batch_indices(n: int, batch_size: int, steps: int, rng: random.Random,
                  lengths: list[int] | None = None) -> list[list[int]]:
    """``steps`` batches of example indices: epochs of reshuffled orders, cut into batch_size runs.

    A batch may straddle two epochs, so every batch is full and every example is seen equally often.
    With ``lengths``, examples longer than LONG_FACTOR x the median (failure→fix prompts are ~3x the
    rest) are batched with each other inside each window of GROUP_WINDOW batches, so a few of them no
    longer pad almost every batch to their length (measured: 2.7k -> 4.7k training tokens/s). The others
    keep their shuffled order: sorting everything by length would make batches one task kind each,
    which measurably hurt learning.
    """
    stream: list[int] = []
    need = steps * batch_size
    while len(stream) < need:
        order = list(range(n))
        rng.shuffle(order)
        stream.extend(order)
    stream = stream[:need]
    if lengths is not None:
        stream = _group_long(stream, lengths, batch_size, rng)
    return [stream[i * batch_size : (i + 1) * batch_size] for i in range(steps)]


def _group_long(stream: list[int], lengths: list[int], batch_size: int, rng: random.Random) -> list[int]:
    """``stream`` with each window's long examples moved together, the window's batches reshuffled."""
    threshold = LONG_FACTOR * sorted(lengths)[len(lengths) // 2]
    window = batch_size * GROUP_WINDOW
    grouped: list[int] = []
    for start in range(0, len(stream), window):
        chunk = stream[start : start + window]
        chunk = [i for i in chunk if lengths[i] <= threshold] + [i for i in chunk if lengths[i] > threshold]
        runs = [chunk[j : j + batch_size] for j in range(0, len(chunk), batch_size)]
        rng.shuffle(runs)
        grouped.extend(i for run in runs for i in run)
    return grouped


def collate(rows: list[Row], pad_id: int) -> tuple[Any, Any, Any]:
    """Right-pad a batch; padded positions are masked out of attention and of the loss."""
    import torch

    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.tensor([ids + [pad_id] * (width - len(ids)) for ids, _ in rows])  # (B, T)
    attention_mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows])  # (B, T)
    labels = torch.tensor([lab + [IGNORE_INDEX] * (width - len(lab)) for _, lab in rows])  # (B, T)
    return input_ids, attention_mask, labels


def padded_batch(rows: list[Row], pad_id: int) -> dict[str, Any]:
    input_ids, attention_mask, labels = collate(rows, pad_id)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def pack_rows(lengths: list[int], width: int) -> list[list[int]]:
    """Example indices grouped into rows of at most ``width`` tokens: first-fit, longest first.

    Deterministic (ties keep the input order), so a batch always packs the same way.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    rows: list[list[int]] = []
    free: list[int] = []
    for i in order:
        for r, room in enumerate(free):
            if lengths[i] <= room:
                rows[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            rows.append([i])
            free.append(width - lengths[i])
    return rows


def packed_batch(rows: list[Row], pad_id: int) -> dict[str, Any]:
    """The batch's examples packed into rows as wide as its longest example.

    Each example's positions restart at 0; with no attention mask and no cache, transformers reads
    the restarts as packed sequences and builds a block-diagonal causal mask, so no token attends
    across examples (the padding tail of a row is a segment of its own). Each example's first label
    is IGNORE_INDEX: the loss shifts labels by one inside a row, and the previous example's last
    position must not learn to predict the next example's first token. (A prompt's first token is
    never a target in a padded batch either.)
    """
    import torch

    width = max(len(ids) for ids, _ in rows)
    input_ids, positions, labels = [], [], []
    for members in pack_rows([len(ids) for ids, _ in rows], width):
        ids_row, pos_row, lab_row = [], [], []
        for i in members:
            ids, lab = rows[i]
            ids_row += ids
            pos_row += range(len(ids))
            lab_row += [IGNORE_INDEX] + lab[1:]
        tail = width - len(ids_row)
        input_ids.append(ids_row + [pad_id] * tail)
        positions.append(pos_row + list(range(tail)))
        labels.append(lab_row + [IGNORE_INDEX] * tail)
    return {"input_ids": torch.tensor(input_ids), "position_ids": torch.tensor(positions),
            "labels": torch.tensor(labels)}


def packing_agrees(model: Any, padded: dict[str, Any], packed: dict[str, Any]) -> bool:
    """Whether ``model`` gives the packed batch the padded batch's loss (its attention honours the
    restarted positions). Models built on transformers' mask utilities do; one that ignores position
    ids for masking would let packed examples attend to each other, and is trained padded."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            losses = [model(**{k: t.to(model.device) for k, t in inputs.items()}, use_cache=False).loss.float()
                      for inputs in (padded, packed)]
    finally:
        model.train(was_training)
    return bool(torch.isclose(losses[0], losses[1], rtol=1e-4, atol=1e-5))
