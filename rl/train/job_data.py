"""The task's rows as a job trains and evaluates on them: loaded once, by the checks before the job starts.

Imports no torch: the driver loads the data while Ray starts beside it, and a torch import there (~1.3 CPU-s)
would hold back the workers' start (docs/BENCHMARKS.md, start-up).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rl.config import Config
from rl.data.jsonl import DataError
from rl.data.loaders import load_task_split, reward_columns
from rl.data.prompts import PromptFitter, prompt_token_limit
from rl.data.tasks import TASKS
from rl.train.faults import FaultLog


@dataclass
class JobData:
    """The task's train split (and test split when the job evaluates), fitted to the prompt-length limit, with the
    over-long prompts of each counted."""

    fitter: PromptFitter
    train_rows: list[dict]
    eval_rows: list[dict]
    over_long: dict[str, int]  # "train data" / "eval data" -> prompts over the limit (dropped or truncated)

    @classmethod
    def load(cls, cfg: Config, tokenizer, model_config=None) -> JobData:
        """A `DataError` names the config key of the split that failed (`data`, or `data.<split>_path`)."""
        fitter = PromptFitter(tokenizer, prompt_token_limit(cfg, model_config), cfg.data.overlong_prompts)
        rows, over_long = {}, {}
        for split, n, what in (("train", None, "train data"), ("test", cfg.train.eval_n, "eval data")):
            if split == "test" and cfg.train.eval_every == 0:
                rows[split] = []
                continue
            try:
                loaded = load_task_split(cfg.data, split, n, tokenizer, cfg.reward.answer_needed_by())
                rows[split], over_long[what] = fitter.fit(loaded, what)
            except DataError as e:
                key = "data" if TASKS[cfg.data.task].generated else f"data.{split}_path"
                raise DataError(f"{key}: {e}") from None
        reward_columns(rows["train"] + rows["test"])  # a column that would shadow a reward argument fails now
        return cls(fitter, rows["train"], rows["test"], over_long)

    def report(self, faults: FaultLog, log: Callable[[str], None]) -> None:
        """The over-long prompts counted in `faults`, and one log line per split that had any."""
        for what, over in self.over_long.items():
            if over:
                action = "dropped" if self.fitter.mode == "drop" else "truncated"
                faults.add(f"prompts_{action}", over)
                rows = len(self.train_rows if what == "train data" else self.eval_rows)
                log(
                    f"{what}: {over} prompts longer than {self.fitter.limit} tokens {action} "
                    f"(data.overlong_prompts={self.fitter.mode}); {rows} rows remain"
                )
