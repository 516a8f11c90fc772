"""What users see, without a training job: the CLI's help and `--print-config`, the step line, the end-of-run
summary, plain text in files, the plots (every panel drawn with data, integer steps, files written), and the
decode-mode record of checkpoints. The console of a real job is checked in tests/test_e2e.py."""

import io
import json
import math
import os
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

from actors import console
from actors.cli import COMMANDS, build_parser, main
from rl import decode_modes
from rl.config import load_config
from rl.report import live_plots, plots
from rl.report.step_lines import console_line
from rl.train.run_dir import RunDir

# ---------------------------------------------------------------------------------------------- CLI


def test_bare_fbrl_prints_help_and_starts_nothing(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: fbrl")
    for name in COMMANDS:
        assert f"    {name}" in out, name
    assert "fbrl COMMAND --help" in out


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_help_is_whole(name, capsys):
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    description = COMMANDS[name][2]
    assert description.splitlines()[0] in out and description.splitlines()[-1] in out  # not cut anywhere
    assert "example" in out
    parser = build_parser(name)
    sub = next(a for a in parser._actions if a.dest == "command").choices[name]
    for action in sub._actions:  # every option and argument says what it is
        assert action.help, f"fbrl {name}: {action.option_strings or action.dest} has no help"


def test_print_config_is_the_whole_resolved_config(tmp_path, capsys):
    assert main(["train", "configs/tiny.yaml", "--print-config", "train.steps=3", "run_dir=runs/x"]) == 0
    text = capsys.readouterr().out
    printed = tmp_path / "printed.yaml"
    printed.write_text(text)
    cfg = load_config(printed)
    assert cfg == load_config(ROOT / "configs" / "tiny.yaml", ["train.steps=3", "train.run_dir=runs/x"])
    # defaults the file does not set are printed too
    for key in ("pretrain:", "faults:", "  verbose: false", "  eps_high: 0.28", "  fusion_mode: gate_product"):
        assert key in text, key
    assert not (ROOT / "runs" / "x").exists()  # nothing started, nothing created


# ---------------------------------------------------------------------------------------------- step line


def _row(step=3, **kw):
    row = {
        "step": step,
        "reward_mean": 0.5,
        "accuracy": 0.4375,
        "response_len_mean": 18.25,
        "truncation_rate": 0.0,
        "logprob_mismatch_abs_mean": 9.7e-8,
        "skipped": 0,
        "time_rollout_s": 1.8,
        "time_reward_s": 0.01,
        "time_learner_s": 2.4,
        "time_sync_s": 0.07,
        "time_step_s": 4.3,
        "reward/rewards/math/errors": 0.0,
        "reward/rewards/math/timeouts": 0.0,
    }
    row.update(kw)
    return row


def test_console_line_is_one_line_with_every_phase():
    line = console_line(_row(), 40)
    assert "\n" not in line
    assert line.startswith("step  3/40 | reward 0.500 acc 0.438 | len 18.2 trunc 0.00 | mismatch 9.7e-08 | ")
    assert "4.3s: rollout 1.8 reward 0.01 learner 2.4 sync 0.07" in line
    assert "kl" not in line and "eval" not in line and "failures" not in line and "skipped" not in line


def test_console_line_says_kl_eval_failures_and_skips():
    line = console_line(
        _row(
            **{
                "learner/kl_loss": 0.0123,
                "eval_accuracy_soft": 0.712,
                "eval_accuracy": 0.712,
                "eval_accuracy_fused": 0.5,
                "time_step_s": 9.0,
                "reward/rewards/judge/errors": 8.0,
                "reward/rewards/judge/timeouts": 0.0,
                "reward/rewards/slow/timeouts": 32.0,
                "skipped": 1,
            }
        ),
        40,
    )
    assert "| kl 1.23e-02 |" in line
    assert "eval/ckpt 4.7" in line  # what the four phases do not account for
    assert "| eval soft 0.712 fused 0.500" in line
    assert "| reward failures: judge 8, slow 32" in line
    assert line.endswith("| skipped: no usable signal")
    assert console_line(_row(accuracy=None, logprob_mismatch_abs_mean=None), 9).startswith(
        "step 3/9 | reward 0.500 acc - | len 18.2 trunc 0.00 | mismatch - |"
    )


# ---------------------------------------------------------------------------------------------- plain text


def test_plain_text_stream_strips_terminal_codes():
    sink = io.StringIO()
    stream = console._PlainText(sink)
    stream.write("\x1b[36m(RankActor pid=1)\x1b[0m loaded\x1b[2K\n")
    assert sink.getvalue() == "(RankActor pid=1) loaded\n"
    assert not stream.isatty()
    assert console.progress_bar(10, enabled=True) is None  # pytest's stderr is not a terminal: no bar


def test_known_vllm_noise_is_dropped_and_warnings_kept():
    import logging

    f = console._DropKnownNoise()
    mk = lambda msg: logging.LogRecord("vllm.x", logging.WARNING, "f", 1, msg, None, None)  # noqa: E731
    assert not f.filter(mk("Chat template warmup failed"))
    assert f.filter(mk("KV cache too small: 3 sequences fit"))


# ---------------------------------------------------------------------------------------------- metrics


def fake_rows(steps=12, modes=("soft", "fused")) -> list[dict]:
    """Rows shaped like a run's metrics.jsonl, with every family of keys the panels read (the mismatch
    parts and the latent-channel keys included), an eval every 4 steps and a skipped step."""
    rows = [{"step": 0, **{f"eval_accuracy_{m}": 0.3 + 0.01 * i for i, m in enumerate(modes)}}]
    for s in range(1, steps + 1):
        r = _row(
            step=s,
            reward_mean=0.4 + 0.02 * s,
            accuracy=0.35 + 0.02 * s,
            response_len_mean=15.0 + s,
            truncation_rate=0.01 * (s % 3),
            skipped=int(s == 5),
            time_step_s=4.5 + (2.0 if s % 4 == 0 else 0),
        )
        r.update(
            {
                "learner/loss": -0.05 + 0.002 * s,
                "learner/pg_loss": -0.05 + 0.002 * s,
                "learner/kl_loss": 1e-3 * s,
                "learner/approx_kl": 0.0,
                "learner/entropy": 0.14 - 0.005 * s,
                "learner/grad_norm": 0.2 + 0.01 * s,
                "learner/pg_clipfrac_low": 0.0,
                "learner/pg_clipfrac_high": 0.001 * s,
                "learner/mismatch/abs_logp_diff": 1e-7 / s,
                "learner/mismatch/k3": 1e-13,
                "learner/mismatch/ratio_outside_frac": 0.0,
                "learner/mismatch/seq_ess": 1.0,
                "mismatch/staleness": 1e-3,
                "reward/rewards/math/mean": 0.35 + 0.02 * s,
                "reward/rewards/format_reward/mean": 0.9,
                "reward/rewards/total/mean": 0.4 + 0.02 * s,
                "learner/latent/w_state_norm": 10.0 + s,
                "learner/latent/w_gate_norm": 7.0,
                "learner/latent/policy_shift": 0.01 * s,
                "learner/latent/gate_mean": 0.5,
            }
        )
        if s % 4 == 0:
            r.update({f"eval_accuracy_{m}": 0.3 + 0.03 * s for m in modes})
        rows.append(r)
    return rows


PANELS = {"reward", "eval_accuracy", "loss", "kl_entropy", "clip_fraction", "length", "mismatch", "step_time", "latent"}


def test_panels_take_every_family_of_keys():
    panels = {p.name: p for p in plots.build_panels(fake_rows())}
    assert set(panels) == PANELS
    labels = lambda name: {s.label for s in panels[name].series}  # noqa: E731
    assert labels("eval_accuracy") == {"soft", "fused"}  # one line per decode mode
    assert {"term: math", "term: format_reward"} <= labels("reward")  # terms when there are several
    assert {"mean |Δ log p| engine vs learner", "mismatch/staleness"} <= labels("mismatch")  # any mismatch part
    assert not any(lab.endswith(("seq_ess", "ratio_outside_frac")) for lab in labels("mismatch"))
    assert labels("latent") == {
        "‖W_U‖ (state weights)",
        "‖W_G‖ (gate weights)",
        "mean |log π_soft − log π_std|",
        "gate mean",
    }
    assert {s.label for s in panels["latent"].series if s.right} == {"mean |log π_soft − log π_std|", "gate mean"}
    assert labels("step_time") == {"rollout", "reward", "learner", "sync", "other (eval, checkpoint)"}
    other = next(s for s in panels["step_time"].series if s.label.startswith("other"))
    assert other.ys[3] == pytest.approx(2.0 + 4.5 - 4.28)  # step 4: an eval step's extra time is "other"
    # a run that logs none of a family simply has no such panel
    bare = [{k: v for k, v in r.items() if not k.startswith("learner/")} for r in fake_rows()]
    assert {p.name for p in plots.build_panels(bare)} == {"reward", "eval_accuracy", "length", "mismatch", "step_time"}


def test_render_draws_every_panel_with_data_and_integer_steps(tmp_path):
    rows = fake_rows()
    written = plots.render(rows, tmp_path / "plots", title="test run")
    assert [p.name for p in written] == ["summary.png"] + [
        f"{n}.png" for n in [p.name for p in plots.build_panels(rows)]
    ]
    from PIL import Image

    sizes = {p.name: Image.open(p).size for p in written}
    assert sizes["summary.png"][0] > 1200 and sizes["summary.png"][1] > 1000  # 3 columns x 3 rows of panels
    for name, (w, h) in sizes.items():
        assert w > 300 and h > 200, (name, w, h)  # a whole panel, not a sliver
    short = fake_rows(3)  # few steps: matplotlib's own ticks would be 0.5, 1.0, 1.5, ...
    fig, axes = plots._figure(plots.build_panels(rows) + plots.build_panels(short), short, 3, "t", 60)
    fig.canvas.draw()
    for ax in axes:
        assert ax.get_title(), "untitled panel"
        assert ax.get_xlabel() == "step"
        drawn = list(ax.lines) + list(ax.patches) + list(getattr(ax, "_fbrl_right", ax).lines)
        ys = [y for a in drawn for y in (a.get_ydata() if hasattr(a, "get_ydata") else [a.get_height()])]
        assert any(math.isfinite(y) for y in ys), f"panel {ax.get_title()!r} has no data"
        assert all(float(t).is_integer() for t in ax.get_xticks()), ax.get_title()


def test_render_before_the_first_step(tmp_path):
    assert plots.render([], tmp_path) == []
    written = plots.render([{"step": 0, "eval_accuracy_soft": 0.3}], tmp_path)  # the baseline eval only
    assert [p.name for p in written] == ["summary.png", "eval_accuracy.png"]


def test_live_plots_draw_in_the_background_and_at_close(tmp_path):
    run = RunDir(str(tmp_path / "run"))
    logged = []
    live = live_plots.LivePlots(run, title="t", every_s=3600, log=logged.append)
    for r in fake_rows(4)[:3]:
        run.log_metrics(r)
        live.update(r)  # no eval yet and not due: nothing drawn, no drawing process
    assert live._proc is None and not (run.path / "plots" / "summary.png").exists()
    run.log_metrics(fake_rows(4)[4])
    live.update(fake_rows(4)[4] | {"eval_accuracy": 0.4})  # an eval step asks for a drawing
    proc = live._proc
    assert proc is not None and proc.pid != os.getpid()  # a process of its own
    written = live.close()
    assert written[0] == run.path / "plots" / "summary.png" and all(p.is_file() for p in written)
    assert proc.poll() == 0 and logged == []  # ended with the run, nothing failed
    assert live.cost_s > 0  # the drawing's own time came back (it paces the next ones)


def test_live_plots_process_runs_at_the_lowest_priority_and_ends_with_its_pipe(tmp_path):
    """It draws with what the workers leave, and a driver that dies (its end of the pipe closed) leaves nothing."""
    run = RunDir(str(tmp_path / "run"))
    run.log_metrics(fake_rows(2)[1])
    live = live_plots.LivePlots(run, title="t", every_s=0)
    live.update({})
    deadline = time.time() + 60
    while live._pending and time.time() < deadline:
        time.sleep(0.05)
    assert (run.path / "plots" / "summary.png").is_file()
    assert os.getpriority(os.PRIO_PROCESS, live._proc.pid) == 19
    live._proc.stdin.close()  # what the kernel does when the driver dies
    assert live._proc.wait(timeout=30) == 0


def test_a_final_drawing_that_hangs_is_stopped(tmp_path, monkeypatch):
    """The end of a job waits for its final drawing at most FINAL_DRAWING_S, then stops it and says so."""
    run = RunDir(str(tmp_path / "run"))
    run.log_metrics(fake_rows(2)[1])
    monkeypatch.setattr(live_plots, "FINAL_DRAWING_S", 2.0)
    monkeypatch.setattr(live_plots, "drawing_argv", lambda *_: [sys.executable, "-c", "import time; time.sleep(600)"])
    logged = []
    live = live_plots.LivePlots(run, every_s=0, log=logged.append)
    live.update({})
    t0 = time.monotonic()
    assert live.close() == []
    assert time.monotonic() - t0 < 30 and live._proc.poll() is not None
    assert logged == ["plots: drawing failed (the final drawing took over 2 s and was stopped)"], logged


def test_a_failing_drawing_is_reported_and_the_run_goes_on(tmp_path):
    run = RunDir(str(tmp_path / "run"))
    for r in fake_rows(2):
        run.log_metrics(r)
    run.log_metrics({"step": "three"})  # a row the panels cannot draw
    logged = []
    live = live_plots.LivePlots(run, every_s=0, log=logged.append)
    live.update({})
    assert live.close() == []
    assert len(logged) == 2 and all(line.startswith("plots: drawing failed (") for line in logged), logged
    assert "training goes on" in logged[0]


# ---------------------------------------------------------------------------------------------- summary


def test_summary_names_existing_paths_and_counts(tmp_path):
    cfg = load_config(ROOT / "configs" / "tiny.yaml", ["train.eval_n=64"])
    run = RunDir(str(tmp_path / "run"))
    rows = fake_rows(8, modes=("soft",))
    rows[3]["reward/rewards/judge/errors"] = 4.0
    rows[-1]["faults/rollout_restarts"] = 1.0
    for r in rows:
        run.log_metrics(r)
    model = run.path / "checkpoints" / "step_000008" / "learner" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (run.path / "checkpoints" / "step_000008" / "trainer_state.json").write_text('{"step": 8}')
    (run.path / "checkpoints" / "latest").write_text("step_000008")
    written = run.plot()
    lines = console.summary_lines(run, cfg, 125.0, written)
    text = "\n".join(lines)
    assert lines[0] == "done: 8 steps in 2 min 05 s (7 trained, 1 skipped)"
    assert "held-out greedy accuracy (soft, 64 problems): 0.300 at step 0 -> 0.540 at step 8 (+24.0 points)" in text
    assert "reward failures (samples scored 0): judge: 4 errors, 0 timeouts" in text
    assert "faults: rollout_restarts 1" in text
    for label in ("policy:", "metrics:", "plots:"):
        line = next(x for x in lines if x.startswith(label))
        assert Path(line.split()[1]).exists(), line
    assert next(x for x in lines if x.startswith("policy:")).split()[1] == str(model)


# ---------------------------------------------------------------------------------------------- decode modes


@pytest.mark.parametrize(
    "name,modes",
    [
        ("tiny-arith", ["standard", "soft"]),
        ("tiny-arith-mixed", ["standard", "soft"]),
        ("tiny-arith-fused", ["standard", "soft", "fused"]),
    ],
)
def test_committed_checkpoints_modes_come_from_their_pretraining(name, modes, tmp_path):
    """The committed checkpoints predate the record (their config.json is left as trained): their modes are read
    from pretrain_config.yaml, and a record, once written, wins over it."""
    ckpt = ROOT / "checkpoints" / name
    assert "fbt_decode_modes" not in json.loads((ckpt / "config.json").read_text())
    assert decode_modes.trained_decode_modes(ckpt) == modes
    (tmp_path / "pretrain_config.yaml").write_text((ckpt / "pretrain_config.yaml").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"fbt_decode_modes": ["fused", "standard"]}))
    assert decode_modes.trained_decode_modes(tmp_path) == ["standard", "fused"]


def test_mode_warning_only_for_untrained_modes(tmp_path):
    mixed = ROOT / "checkpoints" / "tiny-arith-mixed"
    assert decode_modes.mode_warning(mixed, ["soft", "standard"], "--decode-mode") is None
    w = decode_modes.mode_warning(mixed, ["soft", "fused"], "--decode-mode")
    assert w.startswith(f"warning: {mixed} was trained for decode modes standard, soft, not fused (--decode-mode)")
    assert decode_modes.mode_warning(tmp_path, "fused", "x") is None  # unknown: nothing to say


def test_rl_adds_its_mode_to_the_record():
    from types import SimpleNamespace

    config = SimpleNamespace()
    decode_modes.record_rl_mode(config, ROOT / "checkpoints" / "tiny-arith", "fused")
    assert config.fbt_decode_modes == ["standard", "soft", "fused"]


def test_verbose_flag_reaches_config_and_workers():
    from types import SimpleNamespace

    from actors.cli.launch import load_train_config
    from actors.placement import runtime_env

    args = lambda verbose: SimpleNamespace(
        config="configs/tiny.yaml",
        overrides=[],
        resume=None,  # noqa: E731
        verbose=verbose,
    )
    quiet, loud = load_train_config(args(False))[1], load_train_config(args(True))[1]
    assert not quiet.logging.verbose and loud.logging.verbose
    assert console.QUIET_ENV.items() <= runtime_env(quiet)["env_vars"].items()  # Ray workers quieted too
    assert "VLLM_LOGGING_LEVEL" not in runtime_env(loud)["env_vars"]


@pytest.mark.parametrize("init,modes", [("random", ["standard"]), ("identity", ["standard", "soft", "fused"])])
def test_convert_records_the_modes_it_serves(init, modes, tmp_path, capsys):
    """Random fusion weights are untrained (standard only); the identity init decodes like the backbone in every
    mode (tests/test_identity.py), so no mode is warned about."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=97,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
        )
    ).save_pretrained(tmp_path / "src")
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "out"), "--init", init]) == 0
    assert decode_modes.trained_decode_modes(tmp_path / "out") == modes
    warned = decode_modes.mode_warning(tmp_path / "out", "fused", "--decode-mode")
    assert (warned is None) == (init == "identity")


def test_vllm_noise_is_dropped_where_it_would_print(caplog):
    """After `import vllm` (actors/rollout_fleet.py does it before building an engine), the known-harmless warnings no
    longer reach a handler; other warnings do."""
    import logging

    import vllm  # noqa: F401

    console.drop_vllm_noise()
    logger = logging.getLogger("vllm.renderers.base")
    with caplog.at_level(logging.WARNING):
        console.drop_vllm_noise()  # caplog's handler is installed now
        logger.warning("Chat template warmup failed")
        logger.warning("KV cache too small: 3 sequences fit")
    assert [r.getMessage() for r in caplog.records] == ["KV cache too small: 3 sequences fit"]


def test_exported_policy_records_its_modes(tmp_path):
    """RUN_DIR/policy (the policy to take away) carries the record: the starting checkpoint's modes plus RL's."""
    ckpt = ROOT / "checkpoints" / "tiny-arith"
    run = RunDir(str(tmp_path / "run"))
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"stand-in")  # copied, never read here
    out = run.export_policy(weights, ckpt, None, decode_modes.rl_modes(ckpt, "fused"))
    assert json.loads((out / "config.json").read_text())["fbt_decode_modes"] == ["standard", "soft", "fused"]
    assert decode_modes.mode_warning(out, "fused", "x") is None
    assert "fbt_decode_modes" not in json.loads((ckpt / "config.json").read_text())  # the source is untouched
