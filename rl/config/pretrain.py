"""Config sections of `fbrl pretrain`: `model.init`, the architecture of a model built from scratch, and
`pretrain`, multi-pass pretraining / SFT. Only rl/pretrain/trainer.py reads them (the RL job starts from a
checkpoint), so they live apart from schema.py, which imports them into `Config` (the keys stay `pretrain.*` and
`model.init.*`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from rl.config.bounds import ge, within


@dataclass
class ModelInitConfig:
    """Architecture of a model built from scratch (pretrain of the tiny default)."""

    backbone: Literal["llama", "qwen2"] = "llama"
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2  # head_dim = hidden_size / num_heads; vLLM's CPU kernel needs 64
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 256
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True

    def validate(self):
        if self.hidden_size % self.num_heads:
            yield "num_heads", f"must divide hidden_size ({self.hidden_size}), got {self.num_heads}"
        elif self.num_heads % self.num_kv_heads:
            yield "num_kv_heads", f"must divide num_heads ({self.num_heads}), got {self.num_kv_heads}"


@dataclass
class PretrainConfig:
    """Multi-pass pretraining / SFT (`fbrl pretrain`)."""

    steps: int = 2000
    # end after this many steps while the schedules (learning rate, passes) still span `steps`: a budgeted run
    # whose checkpoint is the one the full run writes at that step (null: run all `steps`)
    stop_after: int | None = None
    batch_size: int = 32
    seq_len: int = 96
    lr: float = 1e-3
    # learning rate of the fusion weights (null: `lr`). Converting a trained model, the fusion is new and the
    # backbone is not: the fusion learns at 20-200x the backbone's rate (docs/PRETRAINING.md)
    fusion_lr: float | None = None
    # false: the backbone is frozen and only the fusion trains. Pass-1 loss (the standard model) then cannot
    # move, and each step skips the backbone's weight gradients
    train_backbone: bool = True
    lr_schedule: Literal["cosine", "linear", "constant"] = "cosine"
    min_lr_ratio: float = 0.1
    warmup: int = 100  # steps
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # K passes by step fraction: K=1 until 75% of steps, K=2 until 97%, K=3 to the end (the paper's 75/22/3)
    pass_schedule: list[tuple[float, int]] = field(default_factory=lambda: [(0.75, 1), (0.97, 2), (1.0, 3)])
    schedule: Literal["boundaries", "mixture"] = "boundaries"
    mixture_probs: list[float] = field(default_factory=lambda: [0.75, 0.22, 0.03])  # P(K=1), P(K=2), ...
    # keep: the fusion weights as loaded; identity: set them so that the fused input is the token embedding
    # (linear_addition W_U = 0, W_T = I; concat_projection W_C = [0, I]) before training, so a model trained
    # without feedback starts as its standard self and training grows the latent channel from there
    fusion_init: Literal["keep", "identity"] = "keep"
    # probability that a step trains the exact recurrence alone (backpropagation through time) instead of K
    # passes: the K -> infinity limit, for tasks whose answer needs the state carried over many tokens
    exact_prob: Annotated[float, within(0, 1)] = 0.0
    jitter: float = 0.02  # uniform noise on carried states, training only
    prefix_mixin: Annotated[float, within(0, 1)] = 0.0  # probability of a plain prefix per document and pass
    loss_on: Literal["all", "response"] = "all"  # response: SFT loss mask on the solution tokens only
    # where passes >= 2 fuse the previous pass's state: every position (pretraining, `fused` prompts) or only
    # the loss-masked response positions, the prompt staying plain — exactly what `soft` decoding does
    feedback_on: Literal["all", "response"] = "all"
    eval_every: Annotated[int, ge(0, "(0: at the last step only)")] = 200
    val_batches: int = 4
    out_dir: str = "runs/pretrain"  # never a shipped checkpoint by default: replacing one is deliberate
    seed: int = 0
    threads: int = 2

    def validate(self):
        if self.stop_after is not None and not 1 <= self.stop_after <= self.steps:
            yield "stop_after", f"must be within 1..steps ({self.steps}), got {self.stop_after}"
        fr = [f for f, _ in self.pass_schedule]
        if not fr or fr != sorted(fr) or fr[-1] != 1.0 or fr[0] <= 0:
            yield "pass_schedule", f"fractions must increase in (0, 1] and end at 1.0, got {fr}"
        if any(k < 1 for _, k in self.pass_schedule):
            yield "pass_schedule", "every K must be >= 1"
        if any(p < 0 for p in self.mixture_probs) or abs(sum(self.mixture_probs) - 1) > 1e-6:
            yield "mixture_probs", f"must be >= 0 and sum to 1, got {self.mixture_probs}"
