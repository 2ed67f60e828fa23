"""Pictures of training: the loss curve, the learning-rate schedule, and attention maps with the tokens on the axes."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")  # files only, no windows
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib import ticker  # noqa: E402


def plot_loss_curve(
    steps,
    losses,
    path,
    val_steps=None,
    val_scores=None,
    title="training loss",
    val_losses=None,
    label="loss",
    floor=None,
    smooth=True,
) -> None:
    """Training loss per step (and a smoothed line). At `val_steps`, either validation exact match
    (`val_scores`, on a second axis) or validation loss (`val_losses`, on the loss's own axis).
    `floor`: the lowest loss possible (with label smoothing, the smoothed target's entropy), a dotted line.
    `smooth`: draw a long run's losses faint under their running mean (False: losses already averaged, drawn solid)."""
    if val_scores is not None and val_losses is not None:
        raise ValueError("pass val_scores (exact match) or val_losses (validation loss), not both")
    if val_losses is not None and len(val_losses) != len(val_steps or []):
        raise ValueError(f"val_losses has {len(val_losses)} points but val_steps has {len(val_steps or [])}")
    fig, ax = plt.subplots(figsize=(7, 4))
    short = len(losses) < 20  # a short run is drawn plainly, every step marked; a long one faint, under its mean
    faint = smooth and not short
    ax.plot(
        steps,
        losses,
        "o-" if short else "-",
        color="tab:blue",
        alpha=0.3 if faint else 1.0,
        linewidth=0.8,
        label=label,
    )
    if faint:
        k = max(len(losses) // 50, 5)
        smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
        ax.plot(steps[k - 1 :], smooth, color="tab:blue", label=f"{label} (running mean of {k})")
    if val_losses:
        ax.plot(val_steps, val_losses, "o-", color="tab:orange", label="validation loss (dropout off)")
    if floor is not None:
        ax.axhline(floor, color="gray", linestyle=":", label=f"lowest possible loss ({floor:.2f})")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (label-smoothed)")
    everything = list(losses) + list(val_losses or []) + ([floor] if floor is not None else [])
    low, high = float(np.min(everything)), float(np.max(everything))
    if low > 0 and high / low > 10:  # a long run: the loss falls over decades, read on a log scale in plain numbers
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda y, _: f"{y:g}"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))  # steps are whole numbers, even for 15 of them
    ax.set_title(title)
    handles, labels = ax.get_legend_handles_labels()
    if val_steps and val_scores is not None:
        ax2 = ax.twinx()
        ax2.plot(val_steps, val_scores, "o-", color="tab:orange", label="validation exact match")
        ax2.set_ylabel("exact match")
        ax2.set_ylim(0, 1.02)
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="center right" if val_scores is not None else "upper right")
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
    cols = min(len(panels), 2)
    rows = math.ceil(len(panels) / cols)
    size = 0.22 * max(len(key_tokens), len(query_tokens)) + 1.8  # inches per panel, labels included
    fig, axes = plt.subplots(
        rows, cols, figsize=(cols * size + 1.2, rows * size + 0.6), squeeze=False, layout="constrained"
    )
    for ax, (name, p) in zip(axes.flat, panels, strict=False):
        image = ax.imshow(p, vmin=0.0, vmax=1.0, cmap="viridis")
        ax.set_xticks(range(len(key_tokens)), key_tokens, rotation=90, fontsize=8)
        ax.set_yticks(range(len(query_tokens)), query_tokens, fontsize=8)
        ax.set_title(name, fontsize=10)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="attention probability")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_attention_large(probs: np.ndarray, query_tokens, key_tokens, path, title: str, ylabel: str, xlabel: str):
    """One attention map drawn to be read at a page's column width (about 730 pixels): probs (T_q, T_k),
    each cell's weight printed in it when it is large, labels at 11 points."""
    fig, ax = plt.subplots(figsize=(7.3, 0.34 * len(query_tokens) + 2.2), layout="constrained")
    image = ax.imshow(probs, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(key_tokens)), key_tokens, fontsize=11)
    ax.set_yticks(range(len(query_tokens)), query_tokens, fontsize=11)
    ax.set_xlabel(xlabel, fontsize=11)
    ax.set_ylabel(ylabel, fontsize=11)
    for (i, j), p in np.ndenumerate(probs):
        if p >= 0.3:
            ax.text(j, i, f"{p:.1f}", ha="center", va="center", fontsize=8, color="black" if p > 0.6 else "white")
    ax.set_title(title, fontsize=12)
    fig.colorbar(image, ax=ax, shrink=0.9, label="attention probability")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_attention_maps(
    maps: dict, src_tokens, tgt_tokens, out_dir, example: int = 0, note: str = "", written_tokens=None
) -> list:
    """Draw every attention module of a model (maps as from model.attention_maps(): name ->
    (B, H, T_q, T_k)) for one example of the batch; returns the paths written.

    Encoder self-attention: source x source; decoder self-attention: target x target (causal);
    cross-attention: target queries x source keys. `note` (e.g. "trained", "untrained") goes into each title.
    `written_tokens`, if given, names the decoder's rows by the word each position writes (its input's
    next word) instead of by its input word.
    """
    paths = []
    for name, probs in maps.items():
        probs = np.asarray(probs)[example]
        if name.startswith("encoder"):
            q_tokens, k_tokens = src_tokens, src_tokens
        elif name.endswith("cross_attn"):
            q_tokens, k_tokens = written_tokens or tgt_tokens, src_tokens
        else:
            q_tokens, k_tokens = written_tokens or tgt_tokens, tgt_tokens
        probs = probs[:, : len(q_tokens), : len(k_tokens)]  # drop padding positions
        path = f"{out_dir}/attention_{name.replace('.', '_')}.png"
        plot_attention(probs, q_tokens, k_tokens, path, title=f"{name} ({note})" if note else name)
        paths.append(path)
    return paths


def plot_matrices(matrices: dict, path, title: str, row_labels=None, col_labels=None) -> None:
    """Heatmaps side by side, each entry's value printed in its cell: name -> (rows, cols) array, or
    (H, rows, cols) for one row of panels per head. A probability matrix (every entry in [0, 1]) is drawn
    on a sequential scale from 0 to 1; a gradient on a diverging scale centred at zero, so that the sign
    reads as a colour (red positive, blue negative) and an exact zero as white."""
    stacks = {name: np.asarray(m, dtype=float) for name, m in matrices.items()}
    stacks = {name: m if m.ndim == 3 else m[None] for name, m in stacks.items()}
    heads = next(iter(stacks.values())).shape[0]
    rows, cols = next(iter(stacks.values())).shape[1:]
    fig, axes = plt.subplots(
        heads,
        len(stacks),
        figsize=(len(stacks) * (0.75 * cols + 1.2) + 0.4, heads * (0.6 * rows + 0.9) + 0.5),
        squeeze=False,
        layout="constrained",
    )
    for c, (name, stack) in enumerate(stacks.items()):
        for h in range(heads):
            ax, m = axes[h, c], stack[h]
            if m.min() >= 0 and m.max() <= 1:
                norm, cmap = matplotlib.colors.Normalize(0.0, 1.0), "Greens"
            else:
                top = float(np.abs(m).max()) or 1.0
                norm, cmap = matplotlib.colors.TwoSlopeNorm(0.0, -top, top), "RdBu_r"
            ax.imshow(m, cmap=cmap, norm=norm)
            for (i, j), v in np.ndenumerate(m):
                dark = abs(norm(v) - (0.0 if cmap == "Greens" else 0.5)) > (0.6 if cmap == "Greens" else 0.35)
                text = f"{v:.2f}".replace("-0.00", "0.00")  # a rounding residue is zero, whatever its sign
                ax.text(j, i, text, ha="center", va="center", fontsize=9, color="white" if dark else "black")
            ax.set_xticks(range(cols), col_labels if col_labels is not None else [f"key {j}" for j in range(cols)])
            ax.set_yticks(range(rows), row_labels if row_labels is not None else [f"query {i}" for i in range(rows)])
            ax.tick_params(labelsize=9)
            ax.set_title(f"{name}, head {h}" if heads > 1 else name, fontsize=11)
    fig.suptitle(title + " (each panel on its own colour scale)", fontsize=11)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_computation_graph(nodes: dict, edges: list, path, title: str, size=(7.3, 3.6)) -> None:
    """A computation graph, forward and backward: nodes name -> (x, y, text), edges (source, target, value,
    shape), or (source, target, value, shape, at) or (source, target, value, shape, at, side), the value's name
    written as TeX (`X_{kv}`). Each edge is drawn twice: the forward arrow in black, labelled with the value and
    its shape, and beside it the backward arrow in red, target to source, labelled with the value's gradient (the
    same shape). The labels sit at the fraction `at` of the way from source to target (0.5 unless given), the
    forward one on the left of the forward direction (`side` 1, the default) or on its right (-1), the backward
    one opposite. Where one value feeds several edges,
    their gradients add at the source. An edge whose value is "" (integer ids) has no backward arrow.
    Raises ValueError, naming them, when two labels overlap or a label covers a node: move the nodes or `at`."""
    fig, ax = plt.subplots(figsize=size, layout="constrained")
    xs, ys = [x for x, _, _ in nodes.values()], [y for _, y, _ in nodes.values()]
    ax.set_xlim(min(xs) - 0.7, max(xs) + 0.7)
    ax.set_ylim(min(ys) - 0.6, max(ys) + 0.6)
    ax.axis("off")
    boxes = {
        name: ax.text(
            x,
            y,
            text,
            ha="center",
            va="center",
            fontsize=9,
            zorder=3,
            bbox=dict(boxstyle="round,pad=0.35", facecolor="#eef3fb", edgecolor="#4a6fa5"),
        )
        for name, (x, y, text) in nodes.items()
    }
    fig.canvas.draw()  # lay the boxes out, so that the arrows can stop at their edges
    labels = {}  # what each label says -> its text artist
    lines = {}  # each arrow -> its two ends (data coordinates)
    for source, target, value, shape, *where in edges:
        if len(where) > 2:
            raise ValueError(
                f"edge {source}->{target}: expected (source, target, value, shape[, at[, side]]), "
                f"got {len(where) + 4} items"
            )
        (x0, y0, _), (x1, y1, _) = nodes[source], nodes[target]
        dx, dy = x1 - x0, y1 - y0
        length = math.hypot(dx, dy)
        nx, ny = -dy / length * 0.07, dx / length * 0.07  # a small offset to the left of the forward direction
        arrows = [((x0 + nx, y0 + ny), (x1 + nx, y1 + ny), "black", "-")]
        if value:  # an unnamed value (integer ids) has no gradient: no arrow back
            arrows.append(((x1 - nx, y1 - ny), (x0 - nx, y0 - ny), "tab:red", "--"))
        for start, end, color, style in arrows:
            first, second = (source, target) if color == "black" else (target, source)
            lines[f"arrow {first}->{second}"] = (start, end)
            ax.annotate(
                "",
                end,
                start,
                arrowprops=dict(
                    arrowstyle="-|>",
                    color=color,
                    lw=1.1,
                    linestyle=style,
                    shrinkA=2,
                    shrinkB=2,
                    patchA=boxes[first].get_bbox_patch(),
                    patchB=boxes[second].get_bbox_patch(),
                ),
            )
        t, side = (list(where) + [0.5, 1][len(where) :])[:2]
        mx, my = x0 + t * dx, y0 + t * dy
        label = f"${value}$\n{shape}" if value else shape
        edge = f"{source}->{target}"
        # each label on its arrow's outer side, anchored by the corner nearest the arrow: it never covers it
        labels[f"{edge} {label!r}"] = ax.text(
            mx + 2 * side * nx,
            my + 2 * side * ny,
            label,
            fontsize=8,
            linespacing=1.0,
            **away_from_arrow(side * nx, side * ny),
        )
        if value:
            labels[f"{edge} d{value}"] = ax.text(
                mx - 2 * side * nx,
                my - 2 * side * ny,
                f"$d{value}$",
                fontsize=8,
                color="tab:red",
                **away_from_arrow(-side * nx, -side * ny),
            )
    ax.set_title(title + "\nblack: forward, value and shape; red, dashed: backward, its gradient", fontsize=10)
    patches = {f"node {name}": box.get_bbox_patch() for name, box in boxes.items()}
    clashes = overlapping_labels(fig, labels, patches, lines, ax.transData)
    if clashes:
        plt.close(fig)
        raise ValueError(f"plot_computation_graph({title!r}): labels overlap: {'; '.join(clashes)}")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def away_from_arrow(nx: float, ny: float) -> dict:
    """The text alignment that puts a label on the side (nx, ny) points to: its corner (or edge) nearest the
    arrow at the anchor, the rest of it away from the arrow."""
    ha = "right" if nx < -0.01 else "left" if nx > 0.01 else "center"
    va = "bottom" if ny > 0.01 else "top" if ny < -0.01 else "center"
    return {"ha": ha, "va": va}


def overlapping_labels(fig, labels: dict, boxes: dict, lines: dict, transform) -> list[str]:
    """What a label (name -> text artist) overlaps: another label, a box (name -> patch) or an arrow crossing it
    (name -> its two ends, in the coordinates `transform` maps to the display's), as "label / what" strings;
    empty when the figure reads cleanly."""
    fig.canvas.draw()  # the layout final: the extents and the transform as drawn
    renderer = fig.canvas.get_renderer()
    # a text's extent has a pixel or two of air around its glyphs: a label may come that close to a box
    extents = {name: text.get_window_extent(renderer).expanded(1, 1).padded(-2) for name, text in labels.items()}
    found = []
    names = list(extents)
    for i, a in enumerate(names):
        found += [f"{a} / {b}" for b in names[i + 1 :] if extents[a].overlaps(extents[b])]
        found += [f"{a} / {b}" for b, patch in boxes.items() if extents[a].overlaps(patch.get_window_extent(renderer))]
        for b, ends in lines.items():  # the arrow's points, a pixel apart, inside the label's extent
            start, end = transform.transform(ends)
            points = start + np.linspace(0, 1, int(np.hypot(*(end - start))) + 2)[:, None] * (end - start)
            box = extents[a]
            if (
                (points[:, 0] > box.x0) & (points[:, 0] < box.x1) & (points[:, 1] > box.y0) & (points[:, 1] < box.y1)
            ).any():
                found.append(f"{a} / {b}")
    return found
