"""Argument checks shared by the public entry points.

Every message names the argument, what it got and what was expected, so a mistake is reported
where it is made instead of surfacing later as a broadcasting error or a NaN.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import DTypeLike


def check_score_mask(attn_mask: object, target: tuple[int, int, int, int]) -> None:
    """attn_mask, when given, is a bool array broadcastable to target = (B, H, T_q, T_k): the attention kernels'
    (plain and tiled) mask argument."""
    if attn_mask is None:
        return
    attn_mask = np.asarray(attn_mask)
    if attn_mask.dtype != np.bool_:
        raise TypeError(f"attn_mask must be a bool array (True = may attend), got dtype {attn_mask.dtype}")
    try:
        fits = attn_mask.ndim <= 4 and np.broadcast_shapes(attn_mask.shape, target) == target
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"attn_mask of shape {attn_mask.shape} does not broadcast to (B, H, T_q, T_k) = {target}")


def check_ids(name: str, ids: object, vocab_size: int, max_len: int | None = None) -> np.ndarray:
    """Validate a (B, T) array of token ids; return it as an integer ndarray."""
    if not isinstance(ids, np.ndarray):
        ids = np.asarray(ids)
    if ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"{name} must be an integer array of token ids, got dtype {ids.dtype}")
    if ids.ndim != 2:
        raise ValueError(f"{name} must have shape (B, T), got shape {ids.shape} ({ids.ndim} dimensions)")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"{name} must have at least one row and one position, got shape {ids.shape}")
    if max_len is not None and ids.shape[1] > max_len:
        raise ValueError(
            f"{name} has {ids.shape[1]} positions, longer than config.max_len={max_len} "
            f"(shape {ids.shape}, expected T <= {max_len})"
        )
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"{name} must hold ids in [0, {vocab_size}), got values in [{lo}, {hi}]")
    return ids


def check_attention_mask(attention_mask: object, ids: np.ndarray) -> np.ndarray | None:
    """Validate an attention mask for ids (B, T): the same shape, bool or integer 0/1, 1/True = a real token (the
    meaning of transformers' attention_mask); return it as bool, None when None. Every row needs a real token."""
    if attention_mask is None:
        return None
    mask = np.asarray(attention_mask)
    if not (mask.dtype == np.bool_ or np.issubdtype(mask.dtype, np.integer)):
        raise TypeError(f"attention_mask must be a bool or integer array of 0/1, got dtype {mask.dtype}")
    if mask.shape != ids.shape:
        raise ValueError(f"attention_mask must have the shape of the ids {ids.shape}, got {mask.shape}")
    if mask.dtype != np.bool_ and not np.isin(mask, (0, 1)).all():
        raise ValueError(f"attention_mask must hold 0 (padding) and 1 (a real token), got values {np.unique(mask)}")
    mask = mask.astype(bool)
    if not mask.any(axis=1).all():
        raise ValueError(f"attention_mask: rows {np.flatnonzero(~mask.any(axis=1)).tolist()} have no real token")
    return mask


def mask_positions(mask: np.ndarray) -> np.ndarray:
    """The position of every token of a padded batch, as transformers' generate() computes it from the attention
    mask (B, T): the real tokens before it, cumsum(mask) - 1, and 0 for padding. int64 (B, T)."""
    return np.where(mask, np.cumsum(mask, axis=1) - 1, 0)


def pad_offset_positions(ids: np.ndarray, pad_id: int) -> np.ndarray:
    """RoBERTa's positions (config.positions_after_pad), as transformers' create_position_ids_from_input_ids computes
    them from the ids (B, T): pad_id + the count of real tokens up to and including each one, pad_id at a pad_id
    token. int64 (B, T)."""
    real = ids != pad_id
    return np.where(real, np.cumsum(real, axis=1), 0) + pad_id


def check_float_array(name: str, x: object, dtype: DTypeLike | None = None, shape: tuple | None = None) -> np.ndarray:
    """Validate a floating-point array, optionally of an exact dtype and shape."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}")
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"{name} must be a floating-point array, got dtype {x.dtype}")
    if dtype is not None and x.dtype != dtype:
        raise TypeError(f"{name} must have dtype {np.dtype(dtype)}, got {x.dtype}")
    if shape is not None and x.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {x.shape}")
    return x


def check_bool(name: str, value: object) -> None:
    """A flag: a Python or NumPy bool (not 0/1, not None)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} ({value!r})")


def check_ndim(name: str, x: np.ndarray, ndim: int, letters: str) -> None:
    """Check that x has `ndim` dimensions; `letters` spells the expected shape, e.g. "(B, T, D)"."""
    if x.ndim != ndim:
        raise ValueError(f"{name} must have shape {letters}, got shape {x.shape} ({x.ndim} dimensions)")
