"""Evaluation (rl/train/evaluator.py, `fbrl eval`): estimators by hand, the logic on a scripted engine, the CLI on the
committed checkpoint."""

import json
import math

import pytest
from conftest import ROOT, TINY_ARITH

from rl.data.tokenizer import build_tokenizer
from rl.report.eval_stats import format_table, mcnemar_exact, pass_at_k
from rl.samples.batch import Sample
from rl.samples.request import SamplingParams
from rl.train.evaluator import evaluate, plain_numeric_score

CKPT = TINY_ARITH


def test_mcnemar_exact_by_hand():
    # 7 discordant pairs split 1/6: p = 2 * (C(7,0) + C(7,1)) / 2^7 = 2 * 8/128
    assert mcnemar_exact(1, 6) == pytest.approx(0.125)
    assert mcnemar_exact(6, 1) == pytest.approx(0.125)
    assert mcnemar_exact(0, 5) == pytest.approx(2 / 32)
    assert mcnemar_exact(3, 3) == 1.0 and mcnemar_exact(0, 0) == 1.0
    # 10 vs 20: the two-sided binomial tail, written out
    tail = sum(math.comb(30, i) for i in range(11)) / 2**30
    assert mcnemar_exact(10, 20) == pytest.approx(2 * tail)


def test_pass_at_k_unbiased_estimator_by_hand():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 3, 3) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_plain_numeric_score():
    s = plain_numeric_score(
        ["p"] * 5,
        [" 3+4=7. \\boxed{7}", "\\boxed{6}", "7", "\\boxed{1} then \\boxed{ 7 }", "\\boxed{7}"],
        ["7"] * 5,
        finish_reasons=["stop"] * 4 + ["length"],
    )
    assert s == [1.0, 0.0, 0.0, 1.0, 0.0]


class ScriptedEngine:
    """Answers right on problems the mode 'knows' (standard: even indices, soft: all), wrong otherwise."""

    def __init__(self, tok, rows):
        self.tok, self.rows, self.calls = tok, rows, []

    def generate(self, prompts, params: SamplingParams):
        self.calls.append(params)
        out = []
        for p in prompts:
            i = next(j for j, r in enumerate(self.rows) if self.tok(r["prompt"])["input_ids"] == p)
            right = params.decode_mode == "soft" or i % 2 == 0
            text = f" \\boxed{{{self.rows[i]['answer'] if right else 'x'}}}"
            ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            out += [
                Sample(p, ids, [0.0] * len(ids), "stop", 0, group_id=i, sample_index=k, decode_mode=params.decode_mode)
                for k in range(params.n)
            ]
        return out


def test_evaluate_on_a_scripted_engine():
    tok = build_tokenizer()
    rows = [{"prompt": f"Q: {i}+1=?", "answer": str(i + 1)} for i in range(10)]
    engine = ScriptedEngine(tok, rows)
    res = evaluate(engine, tok, rows, ["standard", "soft"], samples=4, batch_size=3)
    std, soft = res["modes"]["standard"], res["modes"]["soft"]
    assert std["accuracy"] == {"greedy": 0.5, "sampled": 0.5} and soft["accuracy"]["greedy"] == 1.0
    assert set(std["pass_at_k"]) == {"1", "2", "4"} and std["pass_at_k"]["4"] == 0.5
    assert std["truncation_rate"]["greedy"] == 0.0 and std["mean_length"]["greedy"] > 0
    greedy = [p for p in res["paired"] if p["which"] == "greedy"][0]
    assert (greedy["a_only"], greedy["b_only"]) == (0, 5) and greedy["p_value"] == pytest.approx(2 / 32)
    assert {c.temperature for c in engine.calls} == {0.0, 1.0}
    assert all(c.stop_token_ids == (tok.eos_token_id,) for c in engine.calls)
    table = format_table(res)
    assert "standard" in table and "soft" in table and "McNemar" in table


def test_fbrl_eval_on_committed_checkpoint(tmp_path, capsys, monkeypatch):
    assert (CKPT / "model.safetensors").is_file(), "the tiny checkpoint is committed under checkpoints/tiny-arith"
    import rl.data.loaders as loaders
    from actors.cli import main
    from rl.data.arith import split_of

    real_load, loaded = loaders.load_task_split, []

    def recording_load(data, split, *a, **kw):
        rows = real_load(data, split, *a, **kw)
        loaded.append((split, rows))
        return rows

    monkeypatch.setattr(loaders, "load_task_split", recording_load)
    out_json = tmp_path / "eval.json"
    rc = main(
        [
            "eval",
            "--checkpoint",
            str(CKPT),
            "--task",
            "arith",
            "--split",
            "test",
            "--n",
            "20",
            "--decode-mode",
            "standard",
            "soft",
            "fused",
            "--samples",
            "2",
            "--scorer",
            "plain",
            "--threads",
            "1",
            "--json",
            str(out_json),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    for mode in ("standard", "soft", "fused"):
        assert any(line.startswith(mode) for line in out.splitlines()), out
    res = json.loads(out_json.read_text())
    assert res["meta"]["n"] == 20
    for mode in ("standard", "soft", "fused"):
        m = res["modes"][mode]
        assert {"accuracy", "pass_at_k", "mean_length", "truncation_rate"} <= set(m)
        assert 0 <= m["accuracy"]["greedy"] <= 1 and set(m["pass_at_k"]) == {"1", "2"}
    # 3 pairs x (greedy, sampled) x (the anchored read, the lenient one)
    assert sorted((p["a"], p["b"], p["which"]) for p in res["paired"]) == sorted(
        (a, b, which)
        for a, b in [("standard", "soft"), ("standard", "fused"), ("soft", "fused")]
        for which in ("greedy", "sampled", "greedy_lenient", "sampled_lenient")
    )
    # tiny-arith was trained with feedback on the response only (standard, soft): fused is warned about, twice
    warning = f"warning: {CKPT} was trained for decode modes standard, soft, not fused (--decode-mode)"
    assert out.count(warning) == 2 and res["meta"]["warning"].startswith(warning)
    # the held-out split, not the train one: the rows are the test split's (by the task's hash) ...
    ((split, rows),) = loaded
    assert split == "test" and len(rows) == 20 and {split_of(r["question"]) for r in rows} == {"test"}
    # ... and the greedy accuracies are this checkpoint's on those 20 problems (measured: fp32 greedy decoding is
    # deterministic on one torch build; the train split's first 20 give 0.90 / 0.85). The checkpoint never saw
    # fused prompts, so fused decoding answers nothing.
    assert res["modes"]["standard"]["accuracy"]["greedy"] == pytest.approx(17 / 20)
    assert res["modes"]["soft"]["accuracy"]["greedy"] == pytest.approx(16 / 20)
    assert res["modes"]["fused"]["accuracy"]["greedy"] == 0.0


def test_paired_tests_across_checkpoints_and_level_table():
    from rl.report.eval_stats import format_levels, paired_tests

    a = {"greedy": [1, 1, 1, 1, 1, 1, 0, 0], "sampled": [1, 0, 1, 0, 1, 0, 1, 0]}
    b = {"greedy": [0, 0, 0, 0, 0, 1, 0, 1], "sampled": [1, 0, 1, 0, 1, 0, 1, 0]}
    greedy, sampled = paired_tests(a, b, "soft", "baseline:standard")
    # 5 problems only a solves, 1 only b: p = 2 * (C(6,0) + C(6,1)) / 2^6
    assert (greedy["a_only"], greedy["b_only"]) == (5, 1) and greedy["p_value"] == pytest.approx(14 / 64)
    assert (sampled["a_only"], sampled["b_only"], sampled["p_value"]) == (0, 0, 1.0)
    with pytest.raises(ValueError, match="same problems"):
        paired_tests(a, {"greedy": [1], "sampled": [1]}, "soft", "other")
    res = {
        "meta": {"n": 8},
        "modes": {"soft": {"accuracy": {"greedy": 0.75}}, "baseline:standard": {"accuracy": {"greedy": 0.25}}},
        "paired": [greedy, sampled],
    }
    table = format_levels({"8": res})
    assert "| 8 | 8 | 0.750 | 0.250 | +50.0, p=0.22 |" in table, table


def test_fbrl_eval_baseline_by_difficulty_on_a_state_tracking_task(tmp_path, capsys):
    """Two tiny checkpoints on the same cups problems, per chain length: one JSON entry per level, the baseline's
    mode under `baseline:standard`, paired with each mode of the first checkpoint on the same rows."""
    import rl.pretrain.trainer as P
    from actors.cli import main
    from rl.config import load_config

    for name, seed in (("fbt", 0), ("std", 1)):
        cfg = load_config(
            None,
            [
                "model.path=null",
                f"pretrain.seed={seed}",
                "model.init={backbone: llama, "
                "hidden_size: 64, num_layers: 1, num_heads: 1, num_kv_heads: 1, intermediate_size: 64}",
            ],
        )
        model, tok = P.load_model_and_tokenizer(cfg)
        P.save_checkpoint(model, tok, tmp_path / name)
    out_json = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                "--checkpoint",
                str(tmp_path / "fbt"),
                "--baseline",
                str(tmp_path / "std"),
                "--task",
                "cups",
                "--difficulty",
                "6",
                "7",
                "--by-difficulty",
                "--n",
                "6",
                "--decode-mode",
                "soft",
                "standard",
                "--samples",
                "1",
                "--max-tokens",
                "12",
                "--threads",
                "1",
                "--json",
                str(out_json),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "greedy accuracy by level" in out and "| 6 | 6 |" in out and "| 7 | 6 |" in out, out
    res = json.loads(out_json.read_text())
    assert set(res["levels"]) == {"6", "7"} and res["meta"]["baseline"] == str(tmp_path / "std")
    level = res["levels"]["7"]
    assert set(level["modes"]) == {"soft", "standard", "baseline:standard"}
    assert level["meta"]["difficulty"] == [7] and level["meta"]["scorer"] == "score"  # the task's own scorer
    pairs = {(p["a"], p["b"]) for p in level["paired"]}
    assert pairs == {("soft", "standard"), ("soft", "baseline:standard"), ("standard", "baseline:standard")}
    assert len(level["per_problem"]["baseline:standard"]["greedy"]) == 6


def test_lenient_read_takes_the_last_number_anywhere():
    from rl.train.evaluator import last_number, last_number_score

    assert last_number("3 * 4 = 12\n12 - 2 = 10\nSo Ana has 10 pens.") == 10
    assert last_number("It costs $1,250.") == 1250 and last_number("10-3") == 3 and last_number("-7") == -7
    assert last_number("no digits here") is None and last_number("\\boxed{2.50}") == 2.5
    texts = ["\\boxed{18}", "The answer is 18", "18 apples, then 3 more", "18", "eighteen"]
    assert last_number_score([], texts, ["18"] * 5) == [1.0, 1.0, 0.0, 1.0, 0.0]
    # a truncated response counts too (the lenient read ignores finish reasons), a non-numeric gold never does
    assert last_number_score([], ["so 18"], ["18"], finish_reasons=["length"]) == [1.0]
    assert last_number_score([], ["x = 2"], ["x"]) == [0.0]


def test_heldout_eval_reads_strict_and_lenient_apart_and_records_each_problem(tmp_path):
    """Training's held-out eval (rl.train.heldout) runs on the same evaluator: strict is the reward workers' `correct`,
    lenient the last number in the response; each problem's outcome and response go to RUN_DIR/eval in chunks."""
    from rl.config import load_config
    from rl.train.heldout import heldout_accuracy
    from rl.train.run_dir import RunDir
    from rl.train.workers import Scores

    tok = build_tokenizer()
    rows = [{"prompt": f"Q: {i}+1=?", "answer": str(i + 1)} for i in range(7)]
    # problem i answers: boxed and right (i % 3 == 0), right but unboxed (1), boxed and wrong (2)
    texts = [
        f"so \\boxed{{{i + 1}}}" if i % 3 == 0 else f"it is {i + 1}" if i % 3 == 1 else f"\\boxed{{{i}}}"
        for i in range(7)
    ]

    class Rollout:
        calls = []

        def generate(self, prompts, params, version):
            self.calls.append((len(prompts), params.temperature, params.decode_mode, version))
            out = []
            for p in prompts:
                i = next(j for j, r in enumerate(rows) if tok(r["prompt"])["input_ids"] == p)
                ids = tok(texts[i], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                out.append(
                    Sample(p, ids, [0.0] * len(ids), "stop", version, group_id=i, decode_mode=params.decode_mode)
                )
            return out

    class Rewards:
        def score(self, prompts, completions, answers, finish_reasons, columns=None):
            correct = [f"\\boxed{{{a}}}" in c for c, a in zip(completions, answers)]
            return Scores(rewards=[float(c) for c in correct], correct=correct, metrics={}, failures=[])

    cfg = load_config(
        str(ROOT / "configs" / "tiny.yaml"),
        ["train.eval_decode_modes=[standard]", "rollout.vllm.max_num_seqs=2", "rollout.num_engines=1"],
    )
    run, lines = RunDir(str(tmp_path)), []
    rollout = Rollout()
    strict, lenient = heldout_accuracy(
        cfg,
        rows,
        tok,
        rollout,
        Rewards(),
        5,
        encode=lambda r: tok(r["prompt"])["input_ids"],
        run=run,
        step=3,
        log=lines.append,
    )
    assert strict == {"standard": pytest.approx(3 / 7)} and lenient == {"standard": pytest.approx(5 / 7)}
    assert [c[0] for c in rollout.calls] == [4, 3] and {c[1:] for c in rollout.calls} == {(0.0, "standard", 5)}
    assert lines == ["  eval standard: 4/7 problems (0s)", "  eval standard: 7/7 problems (0s)"]
    (record,) = run.read_evals()
    assert record["step"] == 3 and record["answers"] == [r["answer"] for r in rows]
    assert record["modes"]["standard"]["strict"] == [1, 0, 0, 1, 0, 0, 1]
    assert record["modes"]["standard"]["lenient"] == [1, 1, 0, 1, 1, 0, 1]
    assert record["modes"]["standard"]["responses"][1] == "it is 2"
