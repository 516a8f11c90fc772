"""An fbrl config as the keyword arguments of TRL's `GRPOConfig` (run_trl.py): the same batch, sampling, algorithm,
optimizer and run settings, and a refusal naming whatever TRL's GRPOTrainer cannot express. Plain Python: it
imports neither TRL nor torch.
"""

from __future__ import annotations


def map_settings(cfg) -> dict:
    """fbrl config -> GRPOConfig keyword arguments; raises for what TRL's GRPOTrainer cannot express."""
    a, r, lc, t = cfg.algo, cfg.rollout, cfg.learner, cfg.train
    problems = []
    loss_type = {"token_mean": "dapo", "seq_mean_token_mean": "grpo", "seq_mean_token_sum_norm": "dr_grpo"}[a.loss_agg]
    scale = {"grpo": "group", "dr_grpo": "none"}.get(a.adv_estimator)
    if scale is None:
        problems.append(f"algo.adv_estimator={a.adv_estimator} (GRPOTrainer has group-std or no scaling only)")
    if (
        a.dynamic_sampling
        or a.overlong_buffer
        or a.clip_ratio_c is not None
        or a.tis_cap is not None
        or a.entropy_coef
        or a.mini_batches != 1
    ):
        problems.append(
            "dynamic_sampling / overlong_buffer / clip_ratio_c / tis / entropy_coef / mini_batches != 1 "
            "are not mapped here"
        )
    if cfg.rollout.decode_mode != "standard" or cfg.likelihood.estimator != "standard":
        problems.append(
            "TRL decodes and scores without latent feedback: use rollout.decode_mode=standard and "
            "likelihood.estimator=standard"
        )
    if r.top_k == 0 or lc.bf16:
        problems.append("rollout.top_k=0 / learner.bf16 not mapped")
    rows = t.prompts_per_step * r.n_samples_per_prompt
    mbs = lc.micro_batch_size
    if rows % mbs:
        problems.append(f"prompts_per_step x G = {rows} is not a multiple of learner.micro_batch_size={mbs}")
    if problems:
        raise SystemExit("run_trl.py: cannot map: " + "; ".join(problems))
    return dict(
        # batch: one generation of B prompts x G samples per optimizer step, cut into micro-batches of mbs rows
        num_generations=r.n_samples_per_prompt,
        per_device_train_batch_size=mbs,
        gradient_accumulation_steps=rows // mbs,  # steps_per_generation defaults to this: 1 update / batch
        max_completion_length=r.max_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=0 if r.top_k < 0 else r.top_k,
        # algorithm
        loss_type=loss_type,
        scale_rewards=scale,
        beta=a.kl_coef,
        num_iterations=a.ppo_epochs,
        epsilon=a.eps_low,
        epsilon_high=a.eps_high,
        mask_truncated_completions=False,
        # optimizer (fbrl: DeepSpeed AdamW eps 1e-8, clip, WarmupLR only when warmup_steps > 0, else constant)
        learning_rate=lc.lr,
        optim="adamw_torch",
        adam_beta1=lc.adam_betas[0],
        adam_beta2=lc.adam_betas[1],
        adam_epsilon=1e-8,
        weight_decay=lc.weight_decay,
        max_grad_norm=lc.grad_clip,
        lr_scheduler_type="constant_with_warmup" if lc.warmup_steps else "constant",
        warmup_steps=lc.warmup_steps,
        # run
        max_steps=t.steps,
        seed=t.seed,
        data_seed=t.seed,
        shuffle_dataset=False,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_vllm=False,
        use_cpu=True,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        log_completions=False,
    )
