"""The config schema: one nested dataclass per section, and comparing two configs.

A field's own bound is declared on it (`Annotated[int, ge(1)]`, rl/config/bounds.py); rules that relate fields of
one section live in its `validate()` (it yields `(field, message)` problems); rules across sections run at load
time (rl/config/loading.py), which turns every problem into an error carrying the key's location. The defaults
are the embedded CPU default (tiny checkpoint, arithmetic task). The sections of `fbrl pretrain` (`pretrain`,
`model.init`) live in rl/config/pretrain.py, the plain-data / YAML views of a config in rl/config/serialize.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from rl.config.bounds import ge, gt, within
from rl.config.checkpointing import KeepBestConfig, keep_best_problem, save_before_problem
from rl.config.env import EnvConfig
from rl.config.lora import LoraConfig
from rl.config.pretrain import ModelInitConfig, PretrainConfig
from rl.config.runtime import FaultsConfig, LoggingConfig, RayConfig
from rl.config.serialize import flatten, plain, yaml_dump
from rl.data.tasks import TASKS
from rl.decode_modes import DECODE_MODES
from rl.errors import InputError
from rl.samples.temperature import TEMPERATURE_MAX, TEMPERATURE_MIN

DecodeMode = Literal[DECODE_MODES]  # rl/decode_modes.py: the one list of decode modes
_TEMPERATURE_NOTE = "for training rollouts (vLLM's limits, enforced by both engines)"


class ConfigError(InputError):
    """A config problem; the message names the dotted key, where it came from, and what was expected."""


# ----------------------------------------------------------------------------------------------- schema


@dataclass
class ModelConfig:
    # an FBT checkpoint, or a stock Llama / Qwen2 / Qwen3 / Mistral one (converted when the job starts: convert_init);
    # a local directory or a Hugging Face Hub id (the local cache first)
    path: str | None = "checkpoints/tiny-arith"
    tokenizer: str | None = None  # null: the tokenizer saved with `path`
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    fusion_mode: Literal["gate_product", "concat_projection", "linear_addition"] = "gate_product"
    init: ModelInitConfig | None = None  # set: build fresh with this architecture, ignore path
    # the fusion of a stock model.path converted at start: identity (linear_addition unless fusion_mode says
    # concat_projection) starts exactly at the stock model; random is the paper's init (needs fbrl pretrain first)
    convert_init: Literal["identity", "random"] = "identity"


@dataclass
class DataConfig:
    # a name of rl/data/tasks.py's table: arith, word_problems, cups / cups_moved / modsum / parity (generated), or
    # jsonl / json / parquet / csv / hf_disk / hub (rows read from train_path / test_path)
    task: str = "arith"
    # a jsonl / json / parquet / csv file, a `datasets.save_to_disk` dir, or (task hub) a Hub dataset id
    train_path: str | None = None
    test_path: str | None = None  # task hub: defaults to train_path (another split of the same dataset)
    hub_config: str | None = None  # task hub: the dataset's config (subset) name, e.g. "main"
    train_split: str = "train"  # split names (arith: train|val|test; hf_disk / hub: the dataset's splits)
    test_split: str = "test"
    # arith levels to mix (1..4); state-tracking tasks: the chain lengths to mix (1..64)
    difficulty: list[int] = field(default_factory=lambda: [1, 2, 3])
    num_train: int = 20000  # arith: problems generated for the train split
    # word_problems: "small" draws every number from the lowest quarter of its template range
    numbers: Literal["standard", "small"] = "standard"
    # word_problems: worked examples before the problem (0-2)
    shots: Annotated[int, within(0, 2, expected="0, 1 or 2 worked examples")] = 2
    # word_problems: worked steps written as GSM8K's calculator calls, "3 * 4 = <<3*4=12>>12" (with env.name
    # calculator, the tool writes "12>>": docs/TOOLS.md)
    calculator: bool = False
    seed: int = 0
    # arith: fraction of solutions that give the bare answer instead of the worked steps (pretraining / SFT text
    # only; prompts and rewards are unchanged). The demo checkpoint is trained with both behaviours.
    direct_answer_frac: Annotated[float, within(0, 1)] = 0.0
    # dotted paths reach into nested columns (verl: answer_field reward_model.ground_truth); a prompt column
    # holding a list of {role, content} is a chat. The answer is optional unless a reward needs it (math does).
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    messages_field: str = "messages"  # a chat (list of {role, content}) used instead of / beside the prompt
    # auto: chats are rendered with the tokenizer's chat template; on: every prompt goes through it; off: never
    # (base models: chats become plain text)
    chat_template: Literal["auto", "on", "off"] = "auto"
    # Prompts longer than this many tokens (null: the rollout engine's context minus rollout.max_tokens, so every
    # prompt has room for a full response) are dropped when the data is loaded, with a count, or truncated; `error`
    # stops at load. An over-long prompt otherwise kills the job whenever it is sampled, possibly hours in.
    max_prompt_tokens: Annotated[int | None, ge(1)] = None
    overlong_prompts: Literal["drop", "truncate_left", "truncate_right", "error"] = "drop"

    def validate(self):
        if self.task not in TASKS:
            yield "task", f"expected one of {', '.join(TASKS)}, got {self.task!r}"
            return
        task = TASKS[self.task]
        top, what = task.max_difficulty, task.difficulty_means
        if task.generated and (not self.difficulty or any(not 1 <= d <= top for d in self.difficulty)):
            yield "difficulty", f"expected a non-empty list of {what} in 1..{top}, got {self.difficulty}"
        if not task.generated and not self.train_path:
            yield "train_path", f"required when task is {self.task!r}"


@dataclass
class VllmOptions:
    kv_cache_gib: Annotated[float, gt(0)] = 1.0  # CPU: VLLM_CPU_KVCACHE_SPACE
    gpu_memory_utilization: Annotated[float, within(0, 1, low_open=True)] = 0.5
    max_num_seqs: Annotated[int, ge(1)] = 64
    max_model_len: Annotated[int | None, ge(2)] = None  # null: prompt + max_tokens bound
    enforce_eager: bool = True
    enable_prefix_caching: bool = True  # shared prompt prefixes prefilled once (exact: rollout/vllm_env.py)
    tensor_parallel_size: Annotated[int, ge(1)] = 1


@dataclass
class RolloutConfig:
    engine: Literal["vllm", "torch"] = "vllm"
    num_engines: Annotated[int, ge(1)] = 1
    num_gpus_per_engine: Annotated[float, ge(0)] = 0.0
    decode_mode: DecodeMode = "soft"
    temperature: Annotated[float, within(TEMPERATURE_MIN, TEMPERATURE_MAX, note=_TEMPERATURE_NOTE)] = 1.0
    top_p: Annotated[float, within(0, 1, low_open=True)] = 1.0
    top_k: int = -1  # -1: off (vLLM's convention)
    max_tokens: Annotated[int, ge(1)] = 48
    n_samples_per_prompt: Annotated[int, ge(1)] = 8  # G
    # how recorded states (replay) are stored on their way to the learner (rl/samples/states.py): auto = bf16 when
    # the engines have GPUs, else fp32; fp8 = e4m3 with a per-row scale (its replay error: fbrl compare-likelihood)
    record_states_dtype: Literal["auto", "fp32", "bf16", "fp8"] = "auto"
    # How new weights reach the engines (actors/weight_sync.py, docs/CLUSTER.md): a file under RUN_DIR/weights,
    # Ray's object store in buckets, vLLM's native NCCL / CUDA-IPC transfer (GPU), or native_ray (vLLM's native
    # lifecycle with the tensors carried by Ray: the CPU check of the nccl / ipc path); auto picks from placement.
    weight_sync: Literal["auto", "file", "ray", "nccl", "ipc", "native_ray"] = "auto"
    # ray / native_ray: weights per object-store object (and per update call)
    weight_sync_bucket_mb: Annotated[int, ge(1)] = 256
    # torch / OpenMP threads of each engine (vLLM's CPU kernels, the torch engine). null: the cores it may use. A
    # synchronous job on one machine (a local Ray, train.max_staleness 0: nothing else computes while the engines
    # generate) shares all the machine's cores among the engines; otherwise an engine takes the CPUs Ray reserved
    # for it (at least 1).
    num_threads: Annotated[int | None, ge(1)] = None
    vllm: VllmOptions = field(default_factory=VllmOptions)

    def validate(self):
        if self.top_k == 0 or self.top_k < -1:
            yield "top_k", f"expected -1 (off) or >= 1, got {self.top_k}"


@dataclass
class AlgoConfig:
    # Each choice below is a registry's names (rl/algos/: advantages.py, losses.py, mismatch.py), kept equal to
    # the registry by tests/test_config_choices.py: a new entry is registered there and named here.
    adv_estimator: Literal["grpo", "dr_grpo", "rloo"] = "grpo"
    # the policy loss (POLICY_LOSSES). auto: `reinforce` with one update per rollout batch and no dual clip (every
    # ratio is 1 there, so PPO's clipping could not act), else `ppo`
    policy_loss: Literal["auto", "ppo", "reinforce"] = "auto"
    adv_eps: Annotated[float, gt(0, "(0 scales rounding-level reward differences up to advantages of ±1)")] = 1e-6
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = "token_mean"
    eps_low: Annotated[float, ge(0)] = 0.2
    eps_high: Annotated[float, ge(0)] = 0.28
    clip_ratio_c: Annotated[float | None, gt(1, "(dual clip)")] = None  # dual clip; null: off
    kl_coef: Annotated[float, ge(0)] = 0.0  # 0: no reference model
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    entropy_coef: float = 0.0
    dynamic_sampling: bool = False  # drop groups whose rewards are all equal
    overlong_buffer: Annotated[int, ge(0)] = 0  # tokens before max_tokens where the penalty ramps in; 0: off
    overlong_factor: Annotated[float, ge(0)] = 1.0
    # The off-policy correction of the learner/engine ratio r = pi_learner / pi_engine (the engine's log-prob of
    # the sampling version is the denominator; rl/algos/mismatch.py): truncate (TIS, w = min(r, tis_cap); on when
    # tis_cap is set), mask (w = 1 inside tis_bounds, 0 outside), mis (masked IS, w = r inside tis_bounds, 0
    # outside: IcePop at token level, seq-MIS at sequence level). Levels: token, sequence (r = prod r_t), geometric
    # (exp(mean log r_t)). `tis_cap: auto`: truncate at AUTO_TIS_CAP when samples can be stale (train.max_staleness
    # >= 1), off when they cannot; resolved at load, so config.yaml holds the number or null in force. null: off.
    tis_cap: float | Literal["auto"] | None = "auto"
    tis_mode: Literal["truncate", "mask", "mis"] = "truncate"
    tis_level: Literal["token", "sequence", "geometric"] = "token"
    tis_bounds: tuple[float, float] = (0.5, 2.0)
    ppo_epochs: Annotated[int, ge(1)] = 1
    mini_batches: Annotated[int, ge(1)] = 1  # optimizer steps per rollout batch per epoch

    def validate(self):
        if self.policy_loss == "reinforce" and self.clip_ratio_c is not None:
            yield "policy_loss", "reinforce has no ratio to clip: set algo.clip_ratio_c to null, or use ppo"
        if self.kl_coef > 0 and self.kl_estimator == "k1":
            yield (
                "kl_estimator",
                (
                    "k1 has zero expected gradient as a loss term (E[grad log pi] = 0); "
                    "use k2 (the gradient of KL(pi||ref)) or k3 with kl_coef > 0"
                ),
            )
        if not 0 <= self.tis_bounds[0] < self.tis_bounds[1]:
            yield "tis_bounds", f"expected [low, high] with 0 <= low < high, got {list(self.tis_bounds)}"
        if self.tis_cap not in (None, "auto") and self.tis_cap <= 0:
            yield "tis_cap", f"must be > 0 or null, got {self.tis_cap}"


# The truncation cap `tis_cap: auto` means once samples can be stale: verl's rollout correction defaults to a token
# TIS threshold of 2.0, and so do other GRPO stacks (docs/ARCHITECTURE.md compares it with AReaL's decoupled PPO).
AUTO_TIS_CAP = 2.0


@dataclass
class LikelihoodConfig:
    # rl/estimators/likelihood.py's registry (`register_estimator`); the reference's: those that read no recorded
    # states (tests/test_config_choices.py)
    estimator: Literal["replay", "kpass", "exact", "standard"] = "replay"
    passes: Annotated[int, ge(1)] = 3  # K for kpass (the policy's and a kpass reference's)
    # the reference model's log-probs (algo.kl_coef > 0) come from its own recurrence, never the policy's recorded
    # states: exact, or kpass (cheaper for long responses; its error against exact is logged, ref_kpass_abs_err)
    ref_estimator: Literal["exact", "kpass"] = "exact"


@dataclass
class LearnerConfig:
    num_workers: Annotated[int, ge(1)] = 1
    num_gpus_per_worker: Annotated[float, ge(0)] = 0.0
    zero_stage: Annotated[int, within(0, 3, expected="0, 1, 2 or 3")] = 2
    dist_backend: Literal["auto", "gloo", "nccl"] = "auto"
    lr: Annotated[float, gt(0)] = 1e-5
    weight_decay: Annotated[float, ge(0)] = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: Annotated[int, ge(0)] = 0
    grad_clip: Annotated[float, ge(0)] = 1.0
    # A micro-batch holds at most: this many rows,
    micro_batch_size: Annotated[int, ge(1)] = 8
    # this many padded tokens (rows x longest prompt + response: the decoder stack's activations; null: no bound),
    max_tokens_per_micro_batch: Annotated[int | None, ge(1)] = 4096
    # and this many response tokens (the [tokens, vocab] fp32 log-softmax; null: no bound). The same micro-batches
    # compute old, reference and policy log-probs, so these set a step's peak memory, not the rollout batch.
    max_response_tokens_per_micro_batch: Annotated[int | None, ge(1)] = 2048
    # each distinct prompt of a micro-batch computed once, the group's responses attending to its keys / values
    # (soft and standard decoding; rl/estimators/shared_prompt.py); the plan keeps a prompt's rows together
    share_prompts: bool = True
    bf16: bool = False
    torch_adam: bool = True  # DeepSpeed's CPU FusedAdam JIT-compiles for minutes
    # LoRA adapters on the backbone, fusion weights in full (rl/config/lora.py); null: every weight trains
    lora: LoraConfig | None = None
    # torch threads of each learner rank (its intra-op pool). null: the cores it may use. A synchronous job on one
    # machine (a local Ray, train.max_staleness 0: nothing else computes while the learner trains) shares all the
    # machine's cores among the ranks; otherwise a rank takes the CPUs Ray reserved for it (at least 1).
    num_threads: Annotated[int | None, ge(1)] = None

    def validate(self):
        if not all(0 <= b < 1 for b in self.adam_betas):
            yield "adam_betas", f"expected two values in [0, 1), got {list(self.adam_betas)}"
        if self.lora is not None and self.zero_stage == 3:
            # ZeRO-3 partitions every weight, and the merged export would gather base and adapters per layer
            yield "lora", "LoRA runs under learner.zero_stage 0-2 (the frozen base is small enough to replicate)"
        if self.bf16 and self.zero_stage == 0:
            # DeepSpeed without ZeRO sums a step's micro-batch gradients in bf16 (~1 % relative error at 32
            # micro-batches) and refuses fp32 accumulation there; ZeRO 1-3 accumulate in fp32 (deepspeed_setup.py)
            yield "zero_stage", "learner.bf16 needs learner.zero_stage >= 1 (gradients then accumulate in fp32)"


@dataclass
class RewardFnConfig:
    """One reward; the same keys as an entry of `rewards.loader.build_reward_set`."""

    fn: str  # built-in name ("math", "format"), "path/to/file.py:fn" or "pkg.mod:fn"
    weight: float = 1.0
    timeout_s: Annotated[float | None, gt(0)] = None  # null: reward.timeout_s (math: its pool's per-item deadline)
    name: str = ""
    options: dict[str, Any] = field(default_factory=dict)  # keyword arguments for the reward
    # how a user function is called (docs/REWARDS.md): fbrl's (prompts, completions, answers, **row_fields), TRL's
    # GRPOTrainer keywords, verl's compute_score per completion, OpenRLHF's reward_func; auto: by its signature
    convention: Literal["auto", "fbrl", "trl", "verl", "openrlhf"] = "auto"

    def validate(self):
        if ":" not in self.fn and not self.fn.isidentifier():
            yield (
                "fn",
                (f"expected a built-in reward name, 'path/to/file.py:fn' or 'package.module:fn', got {self.fn!r}"),
            )


@dataclass
class RewardConfig:
    fns: list[RewardFnConfig] = field(default_factory=lambda: [RewardFnConfig("math")])
    timeout_s: Annotated[float, gt(0)] = 5.0  # default per-call deadline of user rewards
    num_workers: Annotated[int, ge(1)] = 2
    # the math reward's pool: items of a batch not started this long after it began score 0 as timeouts (a batch
    # of hanging items then takes about this plus the per-item timeout, not items / num_workers timeouts)
    batch_timeout_s: Annotated[float, gt(0)] = 300.0
    # The correctness check behind `accuracy`, `eval_accuracy` and the run's summary, separate from the training
    # reward (docs/REWARDS.md): "auto" (the `math` entry of `fns`, else the math check run beside them at weight
    # 0; strict for the arith task), "none", the name of one of `fns`, or a reward spec run at weight 0.
    accuracy: str = "auto"

    def validate(self):
        if not self.accuracy.strip():
            yield "accuracy", "expected 'auto', 'none', the name of a reward in fns, or a reward spec"
        if not self.fns:
            yield "fns", "needs at least one reward"

    def answer_needed_by(self) -> str | None:
        """What needs every row to carry a reference answer: the built-in math reward (in `fns`, or as the
        correctness check) compares against it; None when nothing does (answers are then optional)."""
        for i, f in enumerate(self.fns):
            if f.fn == "math":
                return f"reward.fns[{i}] (the math reward)"
        return "reward.accuracy (the math check)" if self.accuracy.strip() == "math" else None

    def entries(self) -> list[dict]:
        """`fns` as the dicts `rewards.loader.build_reward_set` takes (unset timeouts left out)."""
        return [{k: v for k, v in plain(f).items() if not (k == "timeout_s" and v is None)} for f in self.fns]


@dataclass
class TrainConfig:
    """The RL job (`fbrl train`)."""

    steps: Annotated[int, ge(1)] = 30
    prompts_per_step: Annotated[int, ge(1)] = 16  # B
    seed: int = 0
    eval_every: Annotated[int, ge(0, "(0: off)")] = 10
    eval_n: Annotated[int, ge(1)] = 500
    eval_decode_modes: list[DecodeMode] = field(default_factory=lambda: ["soft"])
    checkpoint_every: Annotated[int, ge(0, "(0: off)")] = 10
    # the newest N checkpoints are kept, older ones deleted once a new one is complete (null: all are kept)
    keep_checkpoints: Annotated[int | None, ge(1)] = None
    # ... and the `n` best by a metric are never deleted, e.g. {metric: eval_accuracy, n: 2, mode: max}: a
    # checkpoint is ranked by its own step's row (an eval metric: checkpoints of steps with an eval); the ones kept
    # are listed in RUN_DIR/checkpoints/best.json (rl/config/checkpointing.py). null: off
    keep_best: KeepBestConfig | None = None
    # A wall-clock deadline (a scheduler's time limit): the job checkpoints and stops, exit 0, when its next step
    # would likely end past it (from recent step and checkpoint times); `--resume` continues. A duration from the
    # job's start (3h30m, DD:HH:MM:SS, seconds) or an ISO-8601 time with its zone. null: none
    save_before: str | int | None = None
    latent_metrics_rows: int = 4  # rows per step for the latent-channel metrics (rl/report/latent_metrics.py); 0: off
    # Asynchronous training (rl/train/rollout_queue.py): the engines generate the next batches while the learner
    # trains; a sample made by policy version v is trained while the learner holds v..v+s and never later.
    max_staleness: Annotated[int, ge(0, "(0: synchronous)")] = 0
    # Share of each step's rows on which the mismatch is taken apart (engine / staleness / estimator, exact
    # log-probs: rl/estimators/mismatch_parts.py); keeps a CPU copy of the last max_staleness + 1 versions' weights.
    mismatch_parts_frac: Annotated[float, within(0, 1, note="(0: off)")] = 0.0625
    # ... and at most this many response tokens of them (the exact recurrences cost per token)
    mismatch_parts_max_tokens: Annotated[int, ge(0, "(0: no budget)")] = 1024
    run_dir: str | None = None  # null: runs/<date-time>/
    resume: str | None = None  # a run dir to continue

    def validate(self):
        if not self.eval_decode_modes:
            yield "eval_decode_modes", "needs at least one decode mode"
        problem = self.keep_best and keep_best_problem(self.keep_best.metric, self.eval_every, self.eval_decode_modes)
        if problem:
            yield "keep_best.metric", problem
        problem = save_before_problem(self.save_before)
        if problem:
            yield "save_before", problem


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
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    env: EnvConfig | None = None  # tool environments over several turns (rl/config/env.py); null: single turns

    def to_dict(self) -> dict:
        """Plain dicts/lists/scalars (tuples become lists), in schema order."""
        return plain(self)

    def to_yaml(self) -> str:
        return yaml_dump(self.to_dict())

    def flat(self) -> dict[str, Any]:
        """{'train.lr': 1e-6, ...}: every leaf under its dotted key (lists are leaves)."""
        return flatten(self.to_dict())

    def get(self, dotted: str) -> Any:
        obj: Any = self
        for part in dotted.split("."):
            obj = getattr(obj, part)
        return obj
