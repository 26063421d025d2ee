"""What a trainer's settings must agree with, read from a recipe (`[packing] seq_len`, the
tokenizer's path and vocabulary) and the daemon's layout, and the refusal the trainer adapters
(`torchtitan.py`, `hf_trainer.py`) raise when a setting differs: both values and the setting to
change, by name. Plain Python (no torch)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from .errors import ConfigError


@dataclass(frozen=True)
class RecipeFacts:
    """What a trainer takes from a recipe: the window's input length, the tokenizer file and its
    vocabulary (the highest token id + 1, added tokens included)."""

    recipe: Path
    seq_len: int
    tokenizer_path: Path
    vocab_size: int


def _load_toml(path: Path) -> dict:
    try:
        import tomllib  # Python 3.11+
    except ImportError:  # pragma: no cover - Python < 3.11
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            raise ConfigError(f"reading the recipe {path} needs Python 3.11 or `pip install tomli`") from None
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read the recipe {path}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"the recipe {path} is not valid TOML: {e}") from None


def tokenizer_vocab_size(path: Union[str, Path]) -> int:
    """The vocabulary a model needs for this HF `tokenizer.json`: its highest id (model vocabulary
    and added tokens) + 1."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read the tokenizer {path}: {e}") from None
    ids = [int(t["id"]) for t in data.get("added_tokens") or []]
    vocab = (data.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        ids.extend(int(i) for i in vocab.values())
    elif isinstance(vocab, list):  # Unigram: [[piece, score], …], ids are the positions
        ids.append(len(vocab) - 1)
    if not ids:
        raise ConfigError(f"the tokenizer {path} lists no token ids (no model.vocab, no added_tokens)")
    return max(ids) + 1


def recipe_facts(recipe: Union[str, Path]) -> RecipeFacts:
    """`[packing] seq_len` and `[tokenizer] path` (relative to the recipe's folder) of `recipe`,
    and the tokenizer's vocabulary."""
    recipe = Path(recipe)
    data = _load_toml(recipe)
    try:
        seq_len = int(data["packing"]["seq_len"])
        tok = Path(data["tokenizer"]["path"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"the recipe {recipe} has no [packing] seq_len or no [tokenizer] path") from None
    if not tok.is_absolute():
        tok = recipe.resolve().parent / tok
    return RecipeFacts(recipe=recipe, seq_len=seq_len, tokenizer_path=tok, vocab_size=tokenizer_vocab_size(tok))


def require_equal(what: str, trainer_setting: str, trainer_value: Any, dsprep_setting: str, dsprep_value: Any) -> None:
    """Refuse `trainer_setting = trainer_value` unless it equals dsprep's `dsprep_setting`."""
    if trainer_value != dsprep_value:
        raise ConfigError(
            f"{what}: the trainer's {trainer_setting} is {trainer_value!r}, while dsprep's is {dsprep_value!r} "
            f"({dsprep_setting}); set {trainer_setting} = {dsprep_value!r}, or change {dsprep_setting} to {trainer_value!r}"
        )


def require_vocab_covers(model_setting: str, model_vocab: int, tokenizer: Union[str, Path], tokenizer_vocab: int) -> None:
    """Refuse a model whose embedding has fewer rows than the recipe's tokenizer has ids."""
    if model_vocab < tokenizer_vocab:
        raise ConfigError(
            f"the model's vocabulary does not cover the tokenizer's: {model_setting} is {model_vocab}, the recipe's "
            f"tokenizer {tokenizer} has ids up to {tokenizer_vocab - 1} ({tokenizer_vocab} ids); set {model_setting} "
            f">= {tokenizer_vocab}"
        )


def check_layout(
    who: str,
    seq_len: Optional[int],
    seq_len_setting: str,
    micro_batch: Optional[int],
    micro_batch_setting: str,
    served_seq_len: int,
    served_micro_batch: int,
) -> None:
    """A served batch's shape against the trainer's settings (None: not set, not checked)."""
    if seq_len is not None:
        require_equal(f"{who}'s sequence length", seq_len_setting, int(seq_len), "recipe [packing] seq_len", served_seq_len)
    if micro_batch is not None:
        require_equal(f"{who}'s per-rank batch", micro_batch_setting, int(micro_batch), "dsprep serve --micro-batch", served_micro_batch)


def elastic_step(
    saved_world: int, saved_micro_batch: int, world: int, micro_batch: Optional[int], batch_setting: str
) -> None:
    """A saved state continues at another data-parallel world size only with the same global
    batch (world × micro batch): then every global step is the same windows (docs/serving.md,
    "Elastic") and the saved next step is this job's next step."""
    if micro_batch is None:
        return
    saved, now = saved_world * saved_micro_batch, world * int(micro_batch)
    if saved != now:
        fit = saved // world if saved % world == 0 else None
        hint = f"set {batch_setting} = {fit}" if fit else f"use a data-parallel size that divides {saved}"
        raise ConfigError(
            f"the checkpoint's global batch is {saved_world} data-parallel ranks × {saved_micro_batch} = {saved} windows, "
            f"this job's is {world} × {batch_setting} {micro_batch} = {now}: a resume must keep the global batch "
            f"(docs/serving.md, Elastic); {hint}, and serve with --world-size {world} --micro-batch {fit or '?'}"
        )
