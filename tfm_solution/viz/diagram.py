"""The architecture diagram of the encoder–decoder Transformer, with a chapter's blocks highlighted.

The colours follow the legend of the source notes: the encoder's self-attention is yellow,
the decoder's masked self-attention green, the cross-attention (encoder–decoder attention)
purple, the feed-forward layers blue.
"""

from __future__ import annotations

from collections.abc import Iterable

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

_YELLOW, _GREEN, _PURPLE, _BLUE, _GREY, _PINK = "#fde68a", "#bbf7d0", "#ddd6fe", "#bfdbfe", "#f3f4f6", "#fecdd3"

# name: (x, y, width, height, label, fill); the canvas is 10 wide and 12 high.
_BLOCKS: dict[str, tuple[float, float, float, float, str, str]] = {
    "src_embedding": (0.6, 0.5, 3.2, 0.7, "Input Embedding", _PINK),
    "src_position": (0.6, 1.45, 3.2, 0.6, "+ Positional Encoding", _GREY),
    "self_attn": (0.9, 3.0, 2.6, 0.8, "Multi-Head\nSelf-Attention", _YELLOW),
    "enc_norm1": (0.9, 3.9, 2.6, 0.45, "Add & Norm", "#fff7d6"),
    "enc_ffn": (0.9, 4.75, 2.6, 0.7, "Feed Forward", _BLUE),
    "enc_norm2": (0.9, 5.55, 2.6, 0.45, "Add & Norm", "#fff7d6"),
    "tgt_embedding": (6.2, 0.5, 3.2, 0.7, "Output Embedding\n(shifted right)", _PINK),
    "tgt_position": (6.2, 1.45, 3.2, 0.6, "+ Positional Encoding", _GREY),
    "masked_attn": (6.5, 3.0, 2.6, 0.8, "Masked Multi-Head\nSelf-Attention", _GREEN),
    "dec_norm1": (6.5, 3.9, 2.6, 0.45, "Add & Norm", "#fff7d6"),
    "cross_attn": (6.5, 4.75, 2.6, 0.8, "Multi-Head\nCross-Attention", _PURPLE),
    "dec_norm2": (6.5, 5.65, 2.6, 0.45, "Add & Norm", "#fff7d6"),
    "dec_ffn": (6.5, 6.5, 2.6, 0.7, "Feed Forward", _BLUE),
    "dec_norm3": (6.5, 7.3, 2.6, 0.45, "Add & Norm", "#fff7d6"),
    "linear": (6.5, 8.8, 2.6, 0.6, "Linear", _PURPLE),
    "softmax": (6.5, 9.75, 2.6, 0.6, "Softmax", _GREEN),
    "probabilities": (6.2, 10.8, 3.2, 0.6, "Output probabilities", "#ffffff"),
}

#: Named groups a chapter can highlight.
GROUPS: dict[str, tuple[str, ...]] = {
    "embeddings": ("src_embedding", "tgt_embedding"),
    "positional_encoding": ("src_position", "tgt_position"),
    "attention": ("self_attn", "masked_attn", "cross_attn"),
    "masks": ("masked_attn",),
    "feed_forward": ("enc_ffn", "dec_ffn"),
    "norm": ("enc_norm1", "enc_norm2", "dec_norm1", "dec_norm2", "dec_norm3"),
    "generator": ("linear", "softmax"),
}


def _centre_top(name: str) -> tuple[float, float]:
    x, y, w, h, _, _ = _BLOCKS[name]
    return x + w / 2, y + h


def _centre_bottom(name: str) -> tuple[float, float]:
    x, y, w, _, _, _ = _BLOCKS[name]
    return x + w / 2, y


def architecture_diagram(highlight: Iterable[str] = (), title: str | None = None) -> Figure:
    """Draw the encoder–decoder Transformer and outline the chosen blocks in red.

    Args:
        highlight: block names or group names from ``GROUPS`` (e.g. ``["attention"]``).
        title: an optional title above the diagram.

    Returns:
        The matplotlib figure (5 x 6 inches).
    """
    chosen: set[str] = set()
    for name in highlight:
        if name in GROUPS:
            chosen.update(GROUPS[name])
        elif name in _BLOCKS:
            chosen.add(name)
        else:
            raise ValueError(f"unknown block {name!r}; use one of {sorted(GROUPS)} or {sorted(_BLOCKS)}")
    fig = Figure(figsize=(5, 6))
    ax = fig.subplots()
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 11.6)
    ax.axis("off")
    for box_x, label in ((0.5, "Encoder  (N×)"), (6.1, "Decoder  (N×)")):
        height = 3.4 if box_x < 1 else 5.1
        ax.add_patch(FancyBboxPatch((box_x, 2.7), 3.4, height, boxstyle="round,pad=0.05", fc="#fafafa", ec="#9ca3af"))
        ax.text(box_x + 1.7, 2.7 + height + 0.15, label, ha="center", va="bottom", fontsize=9, color="#374151")
    for name, (x, y, w, h, label, fill) in _BLOCKS.items():
        selected = name in chosen
        ax.add_patch(
            FancyBboxPatch(
                (x, y),
                w,
                h,
                boxstyle="round,pad=0.04",
                fc=fill,
                ec="#dc2626" if selected else "#6b7280",
                lw=2.6 if selected else 0.8,
            )
        )
        ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=7.5, weight="bold" if selected else None)
    chain = [
        ("src_embedding", "src_position"),
        ("src_position", "self_attn"),
        ("self_attn", "enc_norm1"),
        ("enc_norm1", "enc_ffn"),
        ("enc_ffn", "enc_norm2"),
        ("tgt_embedding", "tgt_position"),
        ("tgt_position", "masked_attn"),
        ("masked_attn", "dec_norm1"),
        ("dec_norm1", "cross_attn"),
        ("cross_attn", "dec_norm2"),
        ("dec_norm2", "dec_ffn"),
        ("dec_ffn", "dec_norm3"),
        ("dec_norm3", "linear"),
        ("linear", "softmax"),
        ("softmax", "probabilities"),
    ]
    for start, end in chain:
        ax.add_patch(FancyArrowPatch(_centre_top(start), _centre_bottom(end), arrowstyle="-|>", mutation_scale=8, color="#374151"))
    # The encoder's output (the memory) feeds the keys and values of the decoder's cross-attention.
    enc_x, enc_y = _centre_top("enc_norm2")
    cross_x, cross_y, _, cross_h, _, _ = _BLOCKS["cross_attn"]
    ax.plot([enc_x, enc_x, 5.0, 5.0], [enc_y, 6.6, 6.6, cross_y + cross_h / 2], color="#7c3aed", lw=1.2)
    ax.add_patch(
        FancyArrowPatch((5.0, cross_y + cross_h / 2), (cross_x, cross_y + cross_h / 2), arrowstyle="-|>", mutation_scale=8, color="#7c3aed")
    )
    ax.text(3.0, 6.75, "memory → K, V", fontsize=7, color="#7c3aed")
    ax.text(0.6, 0.05, "source tokens", fontsize=7, color="#374151")
    ax.text(6.2, 0.05, "target tokens so far", fontsize=7, color="#374151")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
