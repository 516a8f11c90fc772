"""The data options `fbrl eval` and `fbrl compare-likelihood` share, named after the config's `data` keys, so a
dataset a training job reads is read the same way there: `--task` (any `data.task`), `--data-path` (a file, a
`save_to_disk` directory or a Hub dataset id), `--hub-config`, `--prompt-field`, `--answer-field` (dotted paths
into nested columns) and `--chat-template`."""

from __future__ import annotations

from rl.data.tasks import file_tasks


def add_data_arguments(p, tasks, default: str = "arith", what: str = "") -> None:
    p.add_argument("--task", default=default, choices=list(tasks), help=what or "data.task")
    p.add_argument(
        "--data-path",
        default=None,
        help=f"data.test_path of the file tasks ({', '.join(file_tasks())}): a file, a save_to_disk directory, or "
        "a Hugging Face Hub dataset id (task hub)",
    )
    p.add_argument("--hub-config", default=None, help="data.hub_config: the Hub dataset's config (task hub)")
    p.add_argument("--prompt-field", default="prompt", help="data.prompt_field (a dotted path reaches into columns)")
    p.add_argument("--answer-field", default="answer", help="data.answer_field, e.g. reward_model.ground_truth")
    p.add_argument(
        "--chat-template",
        default="auto",
        choices=["auto", "on", "off"],
        help="render chat rows with the tokenizer's chat template (off: base models)",
    )


def data_section(args, split: str = "test") -> dict:
    """The `data` config keys these options set (a file task without --data-path exits naming it)."""
    data = {
        "task": args.task,
        "chat_template": args.chat_template,
        "prompt_field": args.prompt_field,
        "answer_field": args.answer_field,
    }
    if args.task in file_tasks():
        if not args.data_path:
            raise SystemExit(f"--task {args.task} needs --data-path")
        data.update(train_path=args.data_path, test_path=args.data_path, hub_config=args.hub_config, test_split=split)
    return data
