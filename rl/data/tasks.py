"""The task names of `data.task`, in one place: the schema's choices, the loaders, `fbrl pretrain` and `fbrl eval`
read them from here."""

LEVEL_TASKS = ("arith", "word_problems")  # generated; `data.difficulty` = levels (rl/data/arith.py, ...)
TRACK_TASKS = ("cups", "cups_moved", "modsum", "parity")  # state tracking; difficulty = chain lengths (track.py)
# read from `data.train_path` / `data.test_path` (rl/data/sources.py); hub: a dataset id on the Hugging Face Hub
FILE_TASKS = ("jsonl", "json", "parquet", "csv", "hf_disk", "hub")
GENERATED_TASKS = LEVEL_TASKS + TRACK_TASKS  # generated with their own splits
TASKS = ("arith", *FILE_TASKS, "word_problems", *TRACK_TASKS)
