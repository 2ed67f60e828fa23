"""Pictures of training: the loss curve, the learning-rate schedule, and attention maps with the tokens on the axes."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")  # files only, no windows
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def plot_loss_curve(steps, losses, path, val_steps=None, val_scores=None, title="training loss") -> None:
    """Training loss per step (and a smoothed line); validation exact match on a second axis if given."""
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, losses, color="tab:blue", alpha=0.3, linewidth=0.8, label="loss")
    if len(losses) >= 20:
        k = max(len(losses) // 50, 5)
        smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
        ax.plot(steps[k - 1 :], smooth, color="tab:blue", label=f"loss (mean of {k})")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (label-smoothed)")
    ax.set_yscale("log")
    ax.set_title(title)
    handles, labels = ax.get_legend_handles_labels()
    if val_steps:
        ax2 = ax.twinx()
        ax2.plot(val_steps, val_scores, "o-", color="tab:orange", label="validation exact match")
        ax2.set_ylabel("exact match")
        ax2.set_ylim(0, 1.02)
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_schedule(steps, rates, path, warmup=None, title="learning rate (the paper's schedule)") -> None:
    """The learning rate per step; a dotted line at the end of the warm-up if given."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(steps, rates, color="tab:green")
    if warmup is not None:
        ax.axvline(warmup, color="gray", linestyle=":", label=f"end of warm-up (step {warmup})")
        ax.legend(loc="upper right")
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_attention(probs: np.ndarray, query_tokens, key_tokens, path, title: str) -> None:
    """One figure for one attention module: a heatmap per head and the average over heads, with a colour bar.

    probs (H, T_q, T_k), the attention probabilities of one example; rows are queries (what is
    being computed), columns the keys (what is looked at); each row sums to one.
    """
    H = probs.shape[0]
    panels = [(f"head {h}", probs[h]) for h in range(H)] + [("mean over heads", probs.mean(axis=0))]
    cols = min(len(panels), 3)
    rows = math.ceil(len(panels) / cols)
    size = 0.28 * max(len(key_tokens), len(query_tokens)) + 1.5
    fig, axes = plt.subplots(rows, cols, figsize=(cols * size + 1, rows * size + 0.6), squeeze=False)
    for ax, (name, p) in zip(axes.flat, panels, strict=False):
        image = ax.imshow(p, vmin=0.0, vmax=1.0, cmap="viridis")
        ax.set_xticks(range(len(key_tokens)), key_tokens, rotation=90, fontsize=7)
        ax.set_yticks(range(len(query_tokens)), query_tokens, fontsize=7)
        ax.set_title(name, fontsize=9)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="attention probability")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_attention_maps(maps: dict, src_tokens, tgt_tokens, out_dir, example: int = 0, note: str = "") -> list:
    """Draw every attention module of a model (maps as from model.attention_maps(): name ->
    (B, H, T_q, T_k)) for one example of the batch; returns the paths written.

    Encoder self-attention: source x source; decoder self-attention: target x target (causal);
    cross-attention: target queries x source keys. `note` (e.g. "trained", "untrained") goes into each title.
    """
    paths = []
    for name, probs in maps.items():
        probs = np.asarray(probs)[example]
        if name.startswith("encoder"):
            q_tokens, k_tokens = src_tokens, src_tokens
        elif name.endswith("cross_attn"):
            q_tokens, k_tokens = tgt_tokens, src_tokens
        else:
            q_tokens, k_tokens = tgt_tokens, tgt_tokens
        probs = probs[:, : len(q_tokens), : len(k_tokens)]  # drop padding positions
        path = f"{out_dir}/attention_{name.replace('.', '_')}.png"
        plot_attention(probs, q_tokens, k_tokens, path, title=f"{name} ({note})" if note else name)
        paths.append(path)
    return paths
