"""docs/REWARDS.md section 6 is true: its example files load and score, its configs build the reward set the job
builds, its `run` example prints what the page says, and every message in its failure table is the message the
code gives (each case is provoked here)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from actors.reward_workers import build_scorer
from rewards.loader import RewardLoadError, build_reward_set
from rl.config import ConfigError, config_from_dict

DOC = (ROOT / "docs" / "REWARDS.md").read_text()
SECTION = DOC[DOC.index("## 6. Writing, testing and plugging in a reward function") :]
BLOCK = re.compile(
    r"<!-- (file: (?P<file>\S+)|(?P<kind>config|run)) -->\n```\w+\n(?P<body>.*?)```\n"
    r"(?:```text\n(?P<out>.*?)```\n)?",
    re.S,
)


def blocks(kind: str) -> list[re.Match]:
    return [m for m in BLOCK.finditer(SECTION) if (m["file"] and kind == "file") or m["kind"] == kind]


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    """The page's example files, written where `fbrl train` would run."""
    for m in blocks("file"):
        (tmp_path / m["file"]).write_text(m["body"])
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_page_has_its_examples():
    assert [m["file"] for m in blocks("file")] == ["my_rewards.py", "my_rewards_set.py"]
    assert len(blocks("config")) == 2 and len(blocks("run")) == 1


def test_configs_build_the_reward_sets_they_describe(workdir):
    import yaml

    built = []
    for m in blocks("config"):
        cfg = config_from_dict(yaml.safe_load(m["body"]))  # validates every key, as `fbrl train` does
        reward_set, accuracy = build_scorer(cfg.reward, str(workdir), task="arith")
        built.append({e.name: (e.weight, e.timeout_s) for e in reward_set.entries})
        assert accuracy == "math"  # the correctness check stays the math reward's verdict
        reward_set.close()
    assert built[0] == {"math": (1.0, None), "concise": (0.2, 2.0)}
    assert built[1] == {
        "math": (1.0, None),
        "by_difficulty": (0.5, 5.0),
        "repetition": (1.0, 5.0),
        "judge": (0.5, 30.0),
    }


def test_run_example_prints_what_the_page_says(workdir):
    (m,) = blocks("run")
    proc = subprocess.run(
        [sys.executable, "-c", m["body"]],
        cwd=workdir,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == m["out"]


def test_the_weighted_set_scores(workdir):
    rs = build_reward_set(
        [
            {"fn": "my_rewards_set.py:by_difficulty"},
            {"fn": "my_rewards_set.py:Repetition", "name": "repetition"},
            {"fn": "my_rewards_set.py:judge", "timeout_s": 30},
        ]
    )
    comps = [" \\boxed{52}", " \\boxed{52}", " \\boxed{3}"]
    res = rs(["Q"] * 3, comps, ["52", "52", "52"], finish_reasons=["stop", "stop", "length"], difficulty=[1, 2, 3])
    assert res.per_reward["by_difficulty"] == pytest.approx([0.1, 0.2, 0.0])
    assert res.per_reward["repetition"] == [0.0, 0.0, 0.0]  # seen after this call, penalised from the next
    assert res.per_reward["judge"] == [1.0, 1.0, 0.0] and not res.errors
    assert rs(["Q"], [" \\boxed{52}"], ["52"], finish_reasons=["stop"], difficulty=[1]).per_reward["repetition"] == [
        -0.1
    ]
    rs.close()
    assert rs.entries[1].fn.seen == set()  # close() reached the class


# ---------------------------------------------------------------------------------------------- failure table


def documented(snippet: str) -> None:
    assert f"`{snippet}" in SECTION or snippet in SECTION, f"docs/REWARDS.md lacks: {snippet}"


def check(real: str, doc: str, workdir: Path) -> None:
    """`doc` (the page's text, `...` standing for a variable tail) is in the page and matches the real message."""
    documented(doc)
    real = real.replace(str(workdir), "/abs/path")
    head = doc.split("...")[0]
    assert head in real, (head, real)


def load_error(spec, workdir, **entry) -> str:
    with pytest.raises(RewardLoadError) as e:
        build_reward_set([{"fn": spec, **entry}], base_dir=workdir)
    return str(e.value)


def test_load_failures_say_what_the_page_says(workdir):
    with pytest.raises(ConfigError) as e:
        config_from_dict({"reward": {"fns": [{"fn": "math"}, {"fn": "my_rewards.py"}]}})
    check(
        str(e.value),
        "reward.fns[1].fn: expected a built-in reward name, 'path/to/file.py:fn' or "
        "'package.module:fn', got 'my_rewards.py'",
        workdir,
    )
    check(
        load_error("my_rewards.py:concise", workdir, convention="trlx"),
        "reward 'my_rewards.py:concise': convention: expected one of auto, fbrl, trl, verl, openrlhf, got 'trlx'",
        workdir,
    )
    check(
        load_error("concise", workdir),
        "reward spec 'concise' must look like 'path/to/file.py:fn' or 'package.module:fn'",
        workdir,
    )
    check(
        load_error("nothere.py:f", workdir),
        "reward file not found: /abs/path/nothere.py (from 'nothere.py:f')",
        workdir,
    )
    check(
        load_error("nomod:fn", workdir),
        "reward module 'nomod' not found (from 'nomod:fn'); is it installed or "
        "on PYTHONPATH? A file is written as path/to/file.py:fn",
        workdir,
    )
    (workdir / "sub").mkdir()
    (workdir / "sub" / "my_rewards.py").write_text("x = undefined_name\n")
    real = load_error("sub/my_rewards.py:f", workdir).replace("/sub/", "/")
    check(real, "importing reward file /abs/path/my_rewards.py failed: NameError: ...", workdir)
    check(
        load_error("my_rewards.py:nope", workdir),
        "reward file my_rewards.py has no function 'nope' (from 'my_rewards.py:nope'); callables there: concise",
        workdir,
    )
    (workdir / "more.py").write_text(
        "def two(prompts, completions):\n    return []\n\n"
        "class Judge:\n    def __init__(self, url):\n        self.url = url\n"
    )
    real = load_error("more.py:two", workdir)
    check(
        real,
        "reward function 'two' must accept (prompts, completions, answers, **row_fields); its signature "
        "is (prompts, completions)",
        workdir,
    )
    real = load_error("more.py:Judge", workdir).replace("more.py", "my_rewards.py")
    check(
        real,
        "reward class 'Judge' in reward file my_rewards.py cannot be created without arguments: TypeError: ...",
        workdir,
    )
    check(
        load_error("my_rewards.py:concise", workdir, options={"x": 1}),
        "options ['x'] are only for built-in rewards, not 'my_rewards.py:concise'",
        workdir,
    )
    from rl.data.jsonl import DataError
    from rl.data.loaders import reward_columns

    with pytest.raises(DataError) as e:
        reward_columns([{"prompt": "p", "answer": "a", "answers": "x"}])
    check(
        str(e.value),
        "dataset column(s) ['answers'] would shadow the reward arguments ['prompts', 'completions', "
        "'answers', 'finish_reasons', 'completion_ids']; rename them in the data",
        workdir,
    )
    rcfg = config_from_dict(
        {"reward": {"fns": [{"fn": "math"}, {"fn": "my_rewards.py:concise"}], "accuracy": "judge"}}
    ).reward
    with pytest.raises(RewardLoadError) as e:
        build_scorer(rcfg, str(workdir), task="arith")
    check(
        str(e.value),
        "reward.accuracy: 'judge' is not a reward of reward.fns (math, concise), 'auto' or 'none', "
        "and cannot be loaded as a reward: ...",
        workdir,
    )


def test_call_failures_say_what_the_page_says(workdir):
    from rl.report.step_lines import console_line, report_failures

    (workdir / "bad.py").write_text(
        "import time\n"
        "def boom(prompts, completions, answers, **kw):\n    raise RuntimeError('judge unreachable')\n"
        "def needs(prompts, completions, answers, difficulty, **kw):\n    return [0.1 * d for d in difficulty]\n"
        "def short(prompts, completions, answers, **kw):\n    return [1.0]\n"
        "def nan(prompts, completions, answers, **kw):\n    return [float('nan')] + [1.0] * (len(completions) - 1)\n"
        "def slow(prompts, completions, answers, **kw):\n    time.sleep(3)\n    return [1.0] * len(completions)\n"
    )
    rs = build_reward_set([{"fn": f"bad.py:{n}", "timeout_s": 2} for n in ("boom", "needs", "short", "nan", "slow")])
    res = rs(["Q"] * 4, ["a"] * 4, ["1"] * 4, finish_reasons=["stop"] * 4)
    printed = []
    report_failures(res.errors, set(), printed.append)
    by_name = {re.match(r"reward '(\w+)'", line)[1]: line for line in printed}
    check(
        by_name["boom"],
        "reward 'boom' raised RuntimeError: judge unreachable; scored 0 (printed once; the step lines count repeats)",
        workdir,
    )
    check(
        by_name["needs"],
        "reward 'needs' raised TypeError: needs() missing 1 required positional argument: 'difficulty'; scored 0 ...",
        workdir,
    )
    check(by_name["short"], "reward 'short' returned 1 scores for a batch of 4; scored 0", workdir)
    check(by_name["nan"], "reward 'nan' returned a non-finite, absurd ... or non-numeric score nan; scored 0", workdir)
    check(by_name["slow"], "reward 'slow' timed out after 2 s; scored 0", workdir)
    assert res.metrics["rewards/boom/errors"] == 4 and res.metrics["rewards/nan/errors"] == 1
    assert res.metrics["rewards/slow/timeouts"] == 4
    again = rs(["Q"] * 4, ["a"] * 4, ["1"] * 4, finish_reasons=["stop"] * 4)
    check(
        next(e for e in again.errors if "'slow'" in e),
        "reward 'slow' is still running from an earlier batch (hung); scored 0",
        workdir,
    )
    reported = set()
    report_failures(res.errors, reported, printed.append)
    n = len(printed)
    report_failures(again.errors, reported, printed.append)  # same kinds again: nothing more is printed
    assert len(printed) == n + 1  # ...but "still running" is a new kind of failure for 'slow'
    row = {
        "step": 3,
        "reward_mean": 0.0,
        "accuracy": 0.0,
        "response_len_mean": 1.0,
        "truncation_rate": 0.0,
        "logprob_mismatch_abs_mean": None,
        "skipped": 0,
        "time_rollout_s": 1.0,
        "time_reward_s": 2.0,
        "time_learner_s": 1.0,
        "time_sync_s": 0.1,
        "time_step_s": 4.1,
        "reward/rewards/boom/errors": 256.0,
    }
    assert console_line(row, 10).endswith("| reward failures: boom 256")
    documented("| reward failures: boom 256")
