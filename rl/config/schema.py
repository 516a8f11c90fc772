"""The config schema: one nested dataclass per section, YAML dumping, and comparing two configs.

Rules inside one section live in its `validate()` (it yields `(field, message)` problems; the loader in
rl/config/loading.py turns them into errors carrying the key's location). The defaults are the embedded CPU
default (tiny checkpoint, arithmetic task).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

from rl.config.offpolicy import AsyncTraining, OffPolicyCorrection
from rl.logprob_contract import TEMPERATURE_MAX, TEMPERATURE_MIN

DecodeMode = Literal["standard", "soft", "fused"]


class ConfigError(ValueError):
    """A config problem; the message names the dotted key, where it came from, and what was expected."""


# ----------------------------------------------------------------------------------------------- schema

@dataclass
class ModelInitConfig:
    """Architecture of a model built from scratch (pretrain of the tiny default)."""
    backbone: Literal["llama", "qwen2"] = "llama"
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2          # head_dim = hidden_size / num_heads; vLLM's CPU kernel needs 64
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
class ModelConfig:
    path: Optional[str] = "checkpoints/tiny-arith"   # FBT checkpoint, or a stock HF one to convert
    tokenizer: Optional[str] = None                   # null: the tokenizer saved with `path`
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    fusion_mode: Literal["gate_product", "concat_projection", "linear_addition"] = "gate_product"
    init: Optional[ModelInitConfig] = None            # set: build fresh with this architecture, ignore path


@dataclass
class DataConfig:
    # arith: rl/data/arith.py; word_problems: rl/data/word_problems.py; cups / cups_moved / modsum / parity: state
    # tracking (rl/data/track.py); the rest read files
    task: Literal["arith", "jsonl", "parquet", "hf_disk", "word_problems", "cups", "cups_moved", "modsum",
                  "parity"] = "arith"
    train_path: Optional[str] = None    # jsonl / parquet file, or a `datasets.save_to_disk` dir
    test_path: Optional[str] = None
    train_split: str = "train"          # split names (arith: train|val|test; hf_disk: DatasetDict keys)
    test_split: str = "test"
    # arith levels to mix (1..4); state-tracking tasks: the chain lengths to mix (1..64)
    difficulty: list[int] = field(default_factory=lambda: [1, 2, 3])
    num_train: int = 20000              # arith: problems generated for the train split
    seed: int = 0
    # arith: fraction of solutions that give the bare answer instead of the worked steps (pretraining / SFT text
    # only; prompts and rewards are unchanged). The demo checkpoint is trained with both behaviours.
    direct_answer_frac: float = 0.0
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    messages_field: str = "messages"    # a chat (list of {role, content}) used instead of / beside the prompt
    # auto: chats are rendered with the tokenizer's chat template; on: every prompt goes through it; off: never
    # (base models: chats become plain text)
    chat_template: Literal["auto", "on", "off"] = "auto"
    # Prompts longer than this many tokens (null: the rollout engine's context minus rollout.max_tokens, so every
    # prompt has room for a full response) are dropped when the data is loaded, with a count, or truncated; `error`
    # stops at load. An over-long prompt otherwise kills the job whenever it is sampled, possibly hours in.
    max_prompt_tokens: Optional[int] = None
    overlong_prompts: Literal["drop", "truncate_left", "truncate_right", "error"] = "drop"

    def validate(self):
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            yield "max_prompt_tokens", f"must be >= 1 or null, got {self.max_prompt_tokens}"
        top, what = (4, "levels") if self.task in ("arith", "word_problems") else (64, "chain lengths")
        if not self.difficulty or any(not 1 <= d <= top for d in self.difficulty):
            yield "difficulty", f"expected a non-empty list of {what} in 1..{top}, got {self.difficulty}"
        if not 0.0 <= self.direct_answer_frac <= 1.0:
            yield "direct_answer_frac", f"expected a fraction in [0, 1], got {self.direct_answer_frac}"
        if self.task in ("jsonl", "parquet", "hf_disk") and not self.train_path:
            yield "train_path", f"required when task is {self.task!r}"


@dataclass
class PretrainConfig:
    """Multi-pass pretraining / SFT (`fbrl pretrain`)."""
    steps: int = 2000
    batch_size: int = 32
    seq_len: int = 96
    lr: float = 1e-3
    lr_schedule: Literal["cosine", "linear", "constant"] = "cosine"
    min_lr_ratio: float = 0.1
    warmup: int = 100                     # steps
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # K passes by step fraction: K=1 until 75% of steps, K=2 until 97%, K=3 to the end (the paper's 75/22/3)
    pass_schedule: list[tuple[float, int]] = field(
        default_factory=lambda: [(0.75, 1), (0.97, 2), (1.0, 3)])
    schedule: Literal["boundaries", "mixture"] = "boundaries"
    mixture_probs: list[float] = field(default_factory=lambda: [0.75, 0.22, 0.03])  # P(K=1), P(K=2), ...
    # keep: the fusion weights as loaded; identity: set them so that the fused input is the token embedding
    # (linear_addition W_U = 0, W_T = I; concat_projection W_C = [0, I]) before training, so a model trained
    # without feedback starts as its standard self and training grows the latent channel from there
    fusion_init: Literal["keep", "identity"] = "keep"
    # probability that a step trains the exact recurrence alone (backpropagation through time) instead of K
    # passes: the K -> infinity limit, for tasks whose answer needs the state carried over many tokens
    exact_prob: float = 0.0
    jitter: float = 0.02                  # uniform noise on carried states, training only
    prefix_mixin: float = 0.0             # probability of a plain prefix per document and pass
    loss_on: Literal["all", "response"] = "all"   # response: SFT loss mask on the solution tokens only
    # where passes >= 2 fuse the previous pass's state: every position (pretraining, `fused` prompts) or only
    # the loss-masked response positions, the prompt staying plain — exactly what `soft` decoding does
    feedback_on: Literal["all", "response"] = "all"
    eval_every: int = 200
    val_batches: int = 4
    out_dir: str = "runs/pretrain"        # never a shipped checkpoint by default: replacing one is deliberate
    seed: int = 0
    threads: int = 2

    def validate(self):
        fr = [f for f, _ in self.pass_schedule]
        if not fr or fr != sorted(fr) or fr[-1] != 1.0 or fr[0] <= 0:
            yield "pass_schedule", f"fractions must increase in (0, 1] and end at 1.0, got {fr}"
        if any(k < 1 for _, k in self.pass_schedule):
            yield "pass_schedule", "every K must be >= 1"
        if any(p < 0 for p in self.mixture_probs) or abs(sum(self.mixture_probs) - 1) > 1e-6:
            yield "mixture_probs", f"must be >= 0 and sum to 1, got {self.mixture_probs}"
        if not 0 <= self.exact_prob <= 1:
            yield "exact_prob", f"is a probability, got {self.exact_prob}"
        if not 0 <= self.prefix_mixin <= 1:
            yield "prefix_mixin", f"is a probability, got {self.prefix_mixin}"


@dataclass
class VllmOptions:
    kv_cache_gib: float = 1.0             # CPU: VLLM_CPU_KVCACHE_SPACE
    gpu_memory_utilization: float = 0.5
    max_num_seqs: int = 64
    max_model_len: Optional[int] = None   # null: prompt + max_tokens bound
    enforce_eager: bool = True
    enable_prefix_caching: bool = False   # must stay false (recurrent state); the engine rejects true
    tensor_parallel_size: int = 1

    def validate(self):
        if self.kv_cache_gib <= 0:
            yield "kv_cache_gib", f"must be > 0, got {self.kv_cache_gib}"
        if not 0 < self.gpu_memory_utilization <= 1:
            yield "gpu_memory_utilization", f"expected a fraction in (0, 1], got {self.gpu_memory_utilization}"
        if self.max_num_seqs < 1:
            yield "max_num_seqs", f"must be >= 1, got {self.max_num_seqs}"
        if self.max_model_len is not None and self.max_model_len < 2:
            yield "max_model_len", f"must be >= 2 or null, got {self.max_model_len}"
        if self.tensor_parallel_size < 1:
            yield "tensor_parallel_size", f"must be >= 1, got {self.tensor_parallel_size}"


@dataclass
class RolloutConfig:
    engine: Literal["vllm", "torch"] = "vllm"
    num_engines: int = 1
    num_gpus_per_engine: float = 0.0
    decode_mode: DecodeMode = "soft"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1                       # -1: off (vLLM's convention)
    max_tokens: int = 48
    n_samples_per_prompt: int = 8         # G
    # how recorded states (replay) are stored on their way to the learner (rl/states.py): auto = bf16 when the
    # engines have GPUs, else fp32; fp8 = e4m3 with a per-row scale (its replay error: fbrl compare-likelihood)
    record_states_dtype: Literal["auto", "fp32", "bf16", "fp8"] = "auto"
    # How new weights reach the engines (actors/weight_sync.py, docs/CLUSTER.md): a file under RUN_DIR/weights,
    # Ray's object store in buckets, vLLM's native NCCL / CUDA-IPC transfer (GPU), or native_ray (vLLM's native
    # lifecycle with the tensors carried by Ray: the CPU check of the nccl / ipc path); auto picks from placement.
    weight_sync: Literal["auto", "file", "ray", "nccl", "ipc", "native_ray"] = "auto"
    weight_sync_bucket_mb: int = 256      # ray / native_ray: weights per object-store object (and per update call)
    vllm: VllmOptions = field(default_factory=VllmOptions)

    def validate(self):
        if not 0 < self.top_p <= 1:
            yield "top_p", f"expected a value in (0, 1], got {self.top_p}"
        if not TEMPERATURE_MIN <= self.temperature <= TEMPERATURE_MAX:
            yield "temperature", (f"must be in [{TEMPERATURE_MIN}, {TEMPERATURE_MAX}] for training rollouts (vLLM's "
                                  f"limits, enforced by both engines), got {self.temperature}")
        for name in ("num_engines", "max_tokens", "n_samples_per_prompt", "weight_sync_bucket_mb"):
            if getattr(self, name) < 1:
                yield name, f"must be >= 1, got {getattr(self, name)}"
        if self.num_gpus_per_engine < 0:
            yield "num_gpus_per_engine", f"must be >= 0, got {self.num_gpus_per_engine}"
        if self.top_k == 0 or self.top_k < -1:
            yield "top_k", f"expected -1 (off) or >= 1, got {self.top_k}"


@dataclass
class AlgoConfig(OffPolicyCorrection):
    adv_estimator: Literal["grpo", "dr_grpo", "rloo"] = "grpo"
    adv_eps: float = 1e-6
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = "token_mean"
    eps_low: float = 0.2
    eps_high: float = 0.28
    clip_ratio_c: Optional[float] = None  # dual clip (> 1); null: off
    kl_coef: float = 0.0                  # 0: no reference model
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    entropy_coef: float = 0.0
    dynamic_sampling: bool = False        # drop groups whose rewards are all equal
    overlong_buffer: int = 0              # tokens before max_tokens where the penalty ramps in; 0: off
    overlong_factor: float = 1.0
    # algo.tis_cap / tis_mode / tis_level / tis_bounds: the off-policy correction (rl/config/offpolicy.py)
    ppo_epochs: int = 1
    mini_batches: int = 1                 # optimizer steps per rollout batch per epoch

    def validate(self):
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1:
            yield "clip_ratio_c", f"must be > 1 (dual clip), got {self.clip_ratio_c}"
        if self.eps_low < 0 or self.eps_high < 0:
            yield "eps_low", "clip ranges must be >= 0"
        if self.kl_coef > 0 and self.kl_estimator == "k1":
            yield "kl_estimator", ("k1 has zero expected gradient as a loss term (E[grad log pi] = 0); "
                                   "use k2 (the gradient of KL(pi||ref)) or k3 with kl_coef > 0")
        for name in ("ppo_epochs", "mini_batches"):
            if getattr(self, name) < 1:
                yield name, f"must be >= 1, got {getattr(self, name)}"
        for name in ("adv_eps", "kl_coef", "overlong_buffer", "overlong_factor"):
            if getattr(self, name) < 0:
                yield name, f"must be >= 0, got {getattr(self, name)}"
        yield from self.validate_correction()


@dataclass
class LikelihoodConfig:
    estimator: Literal["replay", "kpass", "exact", "standard"] = "replay"
    passes: int = 3                       # K for kpass (the policy's and a kpass reference's)
    # the reference model's log-probs (algo.kl_coef > 0) come from its own recurrence, never the policy's recorded
    # states: exact, or kpass (cheaper for long responses; its error against exact is logged, ref_kpass_abs_err)
    ref_estimator: Literal["exact", "kpass"] = "exact"

    def validate(self):
        if self.passes < 1:
            yield "passes", f"must be >= 1, got {self.passes}"


@dataclass
class LearnerConfig:
    num_workers: int = 1
    num_gpus_per_worker: float = 0.0
    zero_stage: int = 2
    dist_backend: Literal["auto", "gloo", "nccl"] = "auto"
    lr: float = 1e-5
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    grad_clip: float = 1.0
    # A micro-batch holds at most: this many rows,
    micro_batch_size: int = 8
    # this many padded tokens (rows x longest prompt + response: the decoder stack's activations; null: no bound),
    max_tokens_per_micro_batch: Optional[int] = 4096
    # and this many response tokens (the [tokens, vocab] fp32 log-softmax; null: no bound). The same micro-batches
    # compute old, reference and policy log-probs, so these set a step's peak memory, not the rollout batch.
    max_response_tokens_per_micro_batch: Optional[int] = 2048
    bf16: bool = False
    torch_adam: bool = True               # DeepSpeed's CPU FusedAdam JIT-compiles for minutes

    def validate(self):
        if not 0 <= self.zero_stage <= 3:
            yield "zero_stage", f"expected 0, 1, 2 or 3, got {self.zero_stage}"
        if self.micro_batch_size < 1:
            yield "micro_batch_size", f"must be >= 1, got {self.micro_batch_size}"
        for name in ("max_tokens_per_micro_batch", "max_response_tokens_per_micro_batch"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                yield name, f"must be >= 1 or null, got {getattr(self, name)}"
        if self.num_workers < 1:
            yield "num_workers", f"must be >= 1, got {self.num_workers}"
        if not self.lr > 0:
            yield "lr", f"must be > 0, got {self.lr}"
        for name in ("num_gpus_per_worker", "weight_decay", "warmup_steps", "grad_clip"):
            if getattr(self, name) < 0:
                yield name, f"must be >= 0, got {getattr(self, name)}"
        if not all(0 <= b < 1 for b in self.adam_betas):
            yield "adam_betas", f"expected two values in [0, 1), got {list(self.adam_betas)}"


@dataclass
class RewardFn:
    """One reward; the same keys as an entry of `rewards.loader.build_reward_set`."""
    fn: str                               # built-in name ("math", "format"), "path/to/file.py:fn" or "pkg.mod:fn"
    weight: float = 1.0
    timeout_s: Optional[float] = None     # null: reward.timeout_s (math: its pool's per-item deadline)
    name: str = ""
    options: dict[str, Any] = field(default_factory=dict)   # keyword arguments for the reward

    def validate(self):
        if ":" not in self.fn and not self.fn.isidentifier():
            yield "fn", (f"expected a built-in reward name, 'path/to/file.py:fn' or 'package.module:fn', "
                         f"got {self.fn!r}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            yield "timeout_s", f"must be > 0 or null, got {self.timeout_s}"


@dataclass
class RewardConfig:
    fns: list[RewardFn] = field(default_factory=lambda: [RewardFn("math")])
    timeout_s: float = 5.0                # default per-call deadline of user rewards
    num_workers: int = 2
    # The correctness check behind `accuracy`, `eval_accuracy` and the run's summary, separate from the training
    # reward (docs/REWARDS.md): "auto" (the `math` entry of `fns`, else the math check run beside them at weight
    # 0; strict for the arith task), "none", the name of one of `fns`, or a reward spec run at weight 0.
    accuracy: str = "auto"

    def validate(self):
        if not self.accuracy.strip():
            yield "accuracy", "expected 'auto', 'none', the name of a reward in fns, or a reward spec"
        if not self.fns:
            yield "fns", "needs at least one reward"
        if not self.timeout_s > 0:
            yield "timeout_s", f"must be > 0, got {self.timeout_s}"
        if self.num_workers < 1:
            yield "num_workers", f"must be >= 1, got {self.num_workers}"

    def entries(self) -> list[dict]:
        """`fns` as the dicts `rewards.loader.build_reward_set` takes (unset timeouts left out)."""
        return [{k: v for k, v in _plain(f).items() if not (k == "timeout_s" and v is None)} for f in self.fns]


@dataclass
class TrainConfig(AsyncTraining):
    """The RL job (`fbrl train`)."""
    steps: int = 30
    prompts_per_step: int = 16            # B
    seed: int = 0
    eval_every: int = 10
    eval_n: int = 500
    eval_decode_modes: list[DecodeMode] = field(default_factory=lambda: ["soft"])
    checkpoint_every: int = 10
    latent_metrics_rows: int = 4          # rows per step for the latent-channel metrics (rl/latent_metrics.py); 0: off
    # train.max_staleness / mismatch_parts_frac: asynchronous training (rl/config/offpolicy.py)
    run_dir: Optional[str] = None         # null: runs/<date-time>/
    resume: Optional[str] = None          # a run dir to continue

    def validate(self):
        for name in ("steps", "prompts_per_step", "eval_n"):
            if getattr(self, name) < 1:
                yield name, f"must be >= 1, got {getattr(self, name)}"
        for name in ("eval_every", "checkpoint_every"):
            if getattr(self, name) < 0:
                yield name, f"must be >= 0 (0: off), got {getattr(self, name)}"
        if not self.eval_decode_modes:
            yield "eval_decode_modes", "needs at least one decode mode"
        yield from self.validate_async()


@dataclass
class EvalConfig:
    """`fbrl eval` (checkpoint = model.path, task = data)."""
    split: str = "test"
    n: int = 500
    decode_modes: list[DecodeMode] = field(default_factory=lambda: ["standard", "soft", "fused"])
    samples: int = 1                      # k for pass@k (sampled at `temperature`); greedy always runs
    temperature: float = 1.0
    max_tokens: int = 48
    batch_size: int = 64
    seed: int = 0
    json_out: Optional[str] = None

    def validate(self):
        for name in ("n", "samples", "max_tokens", "batch_size"):
            if getattr(self, name) < 1:
                yield name, f"must be >= 1, got {getattr(self, name)}"


@dataclass
class CompareConfig:
    """`fbrl compare-likelihood` (checkpoint = model.path)."""
    n_samples: int = 16
    max_passes: int = 6
    decode_mode: Literal["soft", "fused"] = "soft"
    seed: int = 0
    json_out: Optional[str] = None
    plot_out: Optional[str] = None


@dataclass
class LoggingConfig:
    wandb_project: str = "fbrl"
    wandb_entity: Optional[str] = None
    wandb_mode: Literal["offline", "online", "disabled"] = "offline"
    log_every: int = 1
    progress: bool = True                 # a progress bar on stderr when it is a terminal
    verbose: bool = False                 # vLLM / Ray workers / DeepSpeed / wandb / transformers output on the console


@dataclass
class RayConfig:
    address: Optional[str] = None         # null: a private local Ray (inside `ray job submit`: the job's cluster)
    num_cpus: Optional[int] = None
    dashboard: bool = False
    colocate: bool = False                # rollout and learner share resources
    # Where actors go (docs/CLUSTER.md): the placement group's strategy over the engine and learner bundles, and
    # custom node resources each role needs (`ray start --resources '{"rollout_node": 8}'` on the nodes that may
    # host it; an amount <= what such a node advertises, e.g. {rollout_node: 1}).
    placement: Literal["pack", "spread", "strict_pack", "strict_spread"] = "pack"
    rollout_resources: dict[str, float] = field(default_factory=dict)
    learner_resources: dict[str, float] = field(default_factory=dict)
    reward_resources: dict[str, float] = field(default_factory=dict)

    def validate(self):
        for role in ("rollout", "learner", "reward"):
            for name, amount in getattr(self, f"{role}_resources").items():
                if amount <= 0 or name in ("CPU", "GPU", "memory"):
                    yield f"{role}_resources", (f"expected custom resource names with amounts > 0 (CPUs and GPUs "
                                                f"come from the role's own keys), got {name}: {amount}")
        if self.num_cpus is not None and self.num_cpus < 1:
            yield "num_cpus", f"must be >= 1 or null, got {self.num_cpus}"


@dataclass
class FaultsConfig:
    """What a job survives inside itself, and when it stops instead (docs/RELIABILITY.md). Every recovery is
    counted under `faults/...` in the metrics and logged in one line."""
    max_rollout_restarts: int = 20        # dead rollout actors replaced over the job (their requests re-issued)
    max_learner_rebuilds: int = 3         # learner group rebuilt from the last checkpoint after a rank died
    max_reward_restarts: int = 20         # dead reward actors restarted (the batch is scored again)
    max_nonfinite_steps: int = 3          # M: steps in a row with non-finite loss or gradients (skipped) -> stop
    reward_error_share: float = 0.5       # a reward erroring or timing out on more than this share of rows ...
    reward_error_steps: int = 3           # ... this many steps in a row stops the job, naming the reward

    def validate(self):
        for name in ("max_rollout_restarts", "max_learner_rebuilds", "max_reward_restarts"):
            if getattr(self, name) < 0:
                yield name, f"must be >= 0, got {getattr(self, name)}"
        for name in ("max_nonfinite_steps", "reward_error_steps"):
            if getattr(self, name) < 1:
                yield name, f"must be >= 1, got {getattr(self, name)}"
        if not 0 <= self.reward_error_share < 1:
            yield "reward_error_share", f"expected a share in [0, 1), got {self.reward_error_share}"


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    likelihood: LikelihoodConfig = field(default_factory=LikelihoodConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)

    def to_dict(self) -> dict:
        """Plain dicts/lists/scalars (tuples become lists), in schema order."""
        return _plain(self)

    def to_yaml(self) -> str:
        return yaml.dump(self.to_dict(), Dumper=_Dumper, sort_keys=False)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_yaml())

    def flat(self) -> dict[str, Any]:
        """{'train.lr': 1e-6, ...}: every leaf under its dotted key (lists are leaves)."""
        return _flatten(self.to_dict())

    def get(self, dotted: str) -> Any:
        obj: Any = self
        for part in dotted.split("."):
            obj = getattr(obj, part)
        return obj


# Keys that no longer exist, with what replaced them (the loader's error says so instead of "unknown key").
RETIRED_KEYS = {
    "likelihood.micro_batch_size": "removed (it was never read); learner.micro_batch_size, "
                                   "max_tokens_per_micro_batch and max_response_tokens_per_micro_batch now bound "
                                   "old, reference and policy log-probs alike",
}

# Fields whose change makes a resumed run a different experiment (checked by `check_resume`).
RESUME_LOCKED = ("model.path", "model.init", "model.fusion_mode", "data", "likelihood.estimator",
                 "likelihood.passes", "rollout.decode_mode", "rollout.n_samples_per_prompt",
                 "train.seed", "train.prompts_per_step", "train.max_staleness",
                 # a DeepSpeed checkpoint loads only with the same world size and ZeRO stage
                 "learner.num_workers", "learner.zero_stage")


class _Dumper(yaml.SafeDumper):
    """Sections as blocks, lists of scalars (and of scalar pairs) inline: `pass_schedule: [[0.75, 1], ...]`."""

    def represent_list(self, data):
        flat = all(not isinstance(v, (dict, list)) or
                   (isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v)) for v in data)
        return self.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flat)


_Dumper.add_representer(list, _Dumper.represent_list)


# ------------------------------------------------------------------------------------------- comparing

def diff_configs(a: Config, b: Config, keys: tuple[str, ...] | list[str] | None = None
                 ) -> dict[str, tuple[Any, Any]]:
    """{dotted key: (value in a, value in b)} for every differing leaf (only under `keys` if given)."""
    fa, fb = a.flat(), b.flat()
    out = {}
    for k in list(fa) + [k for k in fb if k not in fa]:
        if fa.get(k) != fb.get(k) and (keys is None or any(_under(k, p) for p in keys)):
            out[k] = (fa.get(k), fb.get(k))
    return out


def check_resume(saved: Config, current: Config, locked: tuple[str, ...] = RESUME_LOCKED) -> None:
    """Refuse to resume when a locked field changed; the error names every changed field."""
    changed = diff_configs(saved, current, locked)
    if changed:
        lines = "; ".join(f"{k}: {old!r} -> {new!r}" for k, old, new in
                          ((k, *v) for k, v in changed.items()))
        raise ConfigError(f"cannot resume: these fields differ from the saved run's config: {lines}")


def _plain(obj):
    if dataclasses.is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, _join(prefix, k)))
        else:
            out[_join(prefix, k)] = v
    return out


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _under(key: str, prefix: str) -> bool:
    """`key` is `prefix` or beneath it (`prefix.x`, `prefix[0]`)."""
    return key == prefix or key.startswith(prefix + ".") or key.startswith(prefix + "[")
