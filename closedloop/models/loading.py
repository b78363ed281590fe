"""Load, save and fingerprint policy models as Hugging Face directories.

The loop always works on a directory on disk (the DVC-tracked champion, a candidate); a hub id is
accepted so a run can start from a published model that is already in the local cache.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

# Arguments of from_pretrained that transformers 5 writes back into tokenizer_config.json.
_LOADER_KEYS = frozenset({"is_local", "local_files_only", "name_or_path", "_commit_hash", "cache_dir"})


class ModelLoadError(RuntimeError):
    """A policy model or its tokenizer could not be loaded; the message names what was asked for."""


DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")


def resolve_device(device: str = "auto") -> str:
    """``model.device`` as a torch device name: auto is cuda when torch sees a GPU, else cpu.

    Asking for cuda where there is none is an error naming the key, not a silent fall-back to CPU
    (a run meant for a GPU would otherwise take hours on the CPU and look like it worked).
    """
    if device not in DEVICES:
        raise ModelLoadError(f"model.device {device!r}: expected one of {', '.join(DEVICES)}")
    import torch

    available = torch.cuda.is_available()
    if device == "auto":
        return "cuda" if available else "cpu"
    if device == "cuda" and not available:
        raise ModelLoadError(
            "model.device is cuda but torch sees no CUDA GPU (torch.cuda.is_available() is False, torch "
            f"{torch.__version__}); set model.device: auto or cpu in params.yaml"
        )
    return device


def resolve_dtype(dtype: str = "auto", device: str = "cpu", config: Any = None) -> Any:
    """``model.dtype`` as a torch dtype.

    auto is the dtype the model's config.json names (``dtype``, or ``torch_dtype`` in older files):
    float32 for the built-in, bfloat16 for most published models, whatever the device. A config that
    names none gets float32 on cpu and bfloat16 on cuda. An explicit dtype wins over the config.
    """
    if dtype not in DTYPES:
        raise ModelLoadError(f"model.dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    import torch

    if dtype != "auto":
        return getattr(torch, dtype)
    if config is not None and not isinstance(config, dict):
        config = config.to_dict()  # a transformers config; 4.x names the field torch_dtype, 5.x dtype
    config = config or {}
    own = config.get("dtype") or config.get("torch_dtype")
    if isinstance(own, str):
        own = getattr(torch, own.removeprefix("torch."), None)
    if isinstance(own, torch.dtype) and own.is_floating_point:
        return own
    return torch.bfloat16 if device == "cuda" else torch.float32


def load_policy(name_or_path: str | Path, *, device: str = "auto", dtype: str = "auto") -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from a local directory or a hub id, in eval mode.

    ``device`` and ``dtype`` are params.yaml's ``model.device`` / ``model.dtype`` (see resolve_device
    and resolve_dtype): the built-in loads as float32 on the CPU, exactly as before they existed.
    The tokenizer pads on the left, because generation appends to the right end of every row.
    """
    name = str(name_or_path)
    if name.startswith("builtin:"):
        raise ModelLoadError(
            f"{name!r} is not a model directory: resolve builtin models to their directory "
            "(created by closedloop.models.builtin.create_builtin) before loading"
        )
    path = Path(name).expanduser()
    is_local = path.exists()
    if not is_local and (name.startswith((".", "/", "~")) or name.count("/") > 1):
        raise ModelLoadError(f"model directory {name!r} does not exist")
    if is_local and not (path / "config.json").is_file():
        raise ModelLoadError(f"{name!r} is not a Hugging Face model directory (no config.json)")
    device = resolve_device(device)

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a "Loading weights" bar per load drowns the loop's own bars
    source = str(path) if is_local else name
    def load(local_files_only: bool) -> tuple[Any, Any]:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_files_only)
        config = AutoConfig.from_pretrained(source, local_files_only=local_files_only)
        model = AutoModelForCausalLM.from_pretrained(
            source, config=config, dtype=resolve_dtype(dtype, device, config), local_files_only=local_files_only
        )
        return model, tokenizer

    try:
        # The local cache first: without it an unreachable hub costs ~45 s of retries per file.
        model, tokenizer = load(local_files_only=True)
    except (OSError, ValueError) as error:
        if is_local or _hub_offline():
            where = "local directory" if is_local else "hub id (not in the local cache, and HF_HUB_OFFLINE is set)"
            raise ModelLoadError(f"could not load model {name!r} from its {where}: {error}") from error
        try:
            model, tokenizer = load(local_files_only=False)
        except (OSError, ValueError) as error:
            raise ModelLoadError(
                f"could not load model {name!r}: not in the local Hugging Face cache and not downloadable "
                f"from the hub: {error}"
            ) from error
    model.to(device).eval()
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def save_policy(model: Any, tokenizer: Any, out_dir: Path) -> None:
    """Save model and tokenizer into ``out_dir``; identical weights give byte-identical files.

    The weights are written in the dtype the model is in (save_pretrained neither up- nor downcasts,
    and writes that dtype into config.json), so a bfloat16 model stays bfloat16 from load to save.
    """
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Writing model shards" bar per save
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # One shard whatever the size: the file list must not depend on a size threshold.
    model.save_pretrained(out_dir, max_shard_size="100GB")
    # Training sets padding_side="left" on the tokenizer for generation; the saved file must not
    # depend on which code path touched the tokenizer last.
    padding_side = tokenizer.padding_side
    tokenizer.padding_side = "right"
    try:
        tokenizer.save_pretrained(out_dir)
    finally:
        tokenizer.padding_side = padding_side
    _normalise_tokenizer_config(out_dir / "tokenizer_config.json")


def _normalise_tokenizer_config(config_path: Path) -> None:
    """Make tokenizer_config.json depend only on the tokenizer, and loadable by transformers 4.x.

    transformers 5 writes back loader arguments ("is_local", "local_files_only") of the load that
    produced the tokenizer, so a load → save round trip would change the file; they are dropped.
    It also names the generic fast tokenizer "TokenizersBackend", a class transformers 4.x (and vLLM
    builds pinned to it) does not know; "PreTrainedTokenizerFast" is the same class under a name
    both major versions resolve.
    """
    if not config_path.is_file():
        return
    config = json.loads(config_path.read_text(encoding="utf-8"))
    cleaned = {key: value for key, value in config.items() if key not in _LOADER_KEYS}
    if cleaned.get("tokenizer_class") == "TokenizersBackend":
        cleaned["tokenizer_class"] = "PreTrainedTokenizerFast"
    if cleaned != config:
        # The same formatting transformers uses, so the file stays diff-friendly.
        text = json.dumps(cleaned, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        config_path.write_text(text, encoding="utf-8")


def model_fingerprint(model_dir: Path) -> str:
    """sha256 over the sorted relative paths and bytes of every file; the first 16 hex digits."""
    model_dir = Path(model_dir)
    digest = hashlib.sha256()
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        relative = path.relative_to(model_dir).as_posix()
        data = path.read_bytes()
        # Lengths delimit the fields, so moving bytes between a name and its content changes the hash.
        digest.update(f"{len(relative)}:{relative}:{len(data)}:".encode())
        digest.update(data)
    return digest.hexdigest()[:16]
