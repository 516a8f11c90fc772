"""rl.data — where prompts and answers come from, and how text becomes token ids for the tiny default.

Owns: the synthetic arithmetic task with hash-disjoint train/val/test splits (`arith`), the character-level
tokenizer saved with the tiny checkpoint (`tokenizer`), loaders for user datasets (JSONL, parquet, Hugging Face
`datasets` saved to disk) that return rows with `prompt` and `answer`, and the deterministic, resumable prompt
sampler (`loaders`). Pure Python plus `tokenizers`/`transformers` for the tokenizer; no torch needed.
"""
