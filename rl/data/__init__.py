"""rl.data — where prompts and answers come from: tasks, sources, prompts, the tiny default's tokenizer."""
