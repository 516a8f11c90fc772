"""docs/img/tools_latent_state.png: where an FBT's fed-back state goes across a tool call (docs/TOOLS.md).

.venv/bin/python scripts/tools_figure.py [OUT.png]
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# (text, kind): prompt and observation tokens are consumed plainly; generated tokens fuse the state before them
TOKENS = [
    ("48", "prompt"), ("/2", "prompt"), ("?", "prompt"),
    ("<<", "gen"), ("48", "gen"), ("/2", "gen"), ("=", "gen"),
    ("24", "obs"), (">>", "obs"),
    (" so", "gen"), (" 24", "gen"),
]  # fmt: skip
COLOURS = {"prompt": "#d9d9d9", "gen": "#9ecae1", "obs": "#fdd0a2"}
LABELS = {
    "prompt": "prompt: plain input e_t",
    "gen": "sampled by the policy: input F(h_{t-1}, e_t), trained on",
    "obs": "tool's answer: plain input e_t, no loss",
}


def draw(out: Path) -> None:
    fig, ax = plt.subplots(figsize=(11, 3.3))
    for t, (text, kind) in enumerate(TOKENS):
        ax.add_patch(Rectangle((t, 0), 0.9, 0.8, facecolor=COLOURS[kind], edgecolor="black", lw=0.8))
        ax.text(t + 0.45, 0.4, text, ha="center", va="center", fontsize=11, family="monospace")
        ax.text(t + 0.45, -0.25, f"h{t}", ha="center", va="center", fontsize=8, color="#555555")
        if kind == "gen" and t > 0:  # the state of the position before feeds this one
            ax.add_patch(
                FancyArrowPatch(
                    (t - 0.55, 0.85), (t + 0.35, 0.85), connectionstyle="arc3,rad=-0.6", arrowstyle="-|>",
                    mutation_scale=10, color="#08519c", lw=1.2,
                )
            )  # fmt: skip
    for x, colour, style in ((7, "#d94801", "--"), (9, "#d94801", "--")):
        ax.plot([x - 0.05, x - 0.05], [-0.4, 1.65], color=colour, lw=1.5, ls=style)
    ax.text(7 - 0.05, 1.75, "turn 1 stops at '='", ha="center", fontsize=9, color="#d94801")
    ax.text(9 - 0.05, 1.75, "turn 2: replay prefill of 0-8, then decode", ha="left", fontsize=9, color="#d94801")
    ax.text(9.5, 1.35, "' so' fuses h8, the state at the tool's last token", fontsize=8, color="#08519c")
    for i, (kind, label) in enumerate(LABELS.items()):
        y = -0.7 - 0.4 * i
        ax.add_patch(Rectangle((0.1, y - 0.15), 0.3, 0.3, facecolor=COLOURS[kind], edgecolor="black", lw=0.6))
        ax.text(0.55, y, label, va="center", fontsize=8)
    ax.set_xlim(-0.3, len(TOKENS) + 2.5)
    ax.set_ylim(-1.7, 2.0)
    ax.axis("off")
    fig.savefig(out, dpi=130, bbox_inches="tight")


if __name__ == "__main__":
    draw(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "img" / "tools_latent_state.png")
