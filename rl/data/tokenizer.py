"""The character-level tokenizer of the tiny default, saved with its checkpoint.

Owns: building it (`build_tokenizer`), saving it (`save_tokenizer`) and loading it (`load_tokenizer`).

One token per character over a fixed alphabet (printable ASCII, newline, tab), with `<pad>`=0, `<bos>`=1,
`<eos>`=2, `<unk>`=3: 101 ids. It is a `PreTrainedTokenizerFast` over a `tokenizers` BPE model with no merges
(BPE starts from single characters, so with no merges every character is its own token), with a `Fuse` decoder
(no spaces inserted between tokens) and `clean_up_tokenization_spaces=False` (transformers' cleanup would turn
" ." into "."), so `decode(encode(x)) == x` for any text over the alphabet. Encoding prepends `<bos>` by
default (a post-processor), because BOS is where feedback resets; `add_special_tokens=False` gives bare
characters. `AutoTokenizer.from_pretrained(dir)` (and vLLM) load the saved directory.
"""

from __future__ import annotations

import string
from pathlib import Path

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]
# printable ASCII (digits, letters, punctuation incl. \ { } ^ _, space) plus newline and tab
ALPHABET = "".join(c for c in string.printable if c not in "\r\x0b\x0c")


def build_tokenizer(alphabet: str = ALPHABET, add_bos: bool = True, model_max_length: int = 1024):
    """A fresh character-level PreTrainedTokenizerFast (ids: specials 0..3, then `alphabet` in order)."""
    from tokenizers import Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    chars = list(dict.fromkeys(alphabet))  # de-duplicated, order kept
    if any(len(c) != 1 for c in chars):
        raise ValueError("alphabet must be a string of single characters")
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tok.decoder = decoders.Fuse()
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, vocab[BOS])]
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )
    assert fast.pad_token_id == 0 and fast.bos_token_id == 1 and fast.eos_token_id == 2, "special ids moved"
    return fast


# tokenizer_config.json's names for the class that wraps a tokenizer.json as it is (transformers 5; 4)
TOKENIZERS_BACKEND = ("TokenizersBackend", "PreTrainedTokenizerFast")


def save_tokenizer(directory: str | Path, **kwargs):
    """Build and `save_pretrained` into `directory` (e.g. a checkpoint dir); returns the tokenizer."""
    tok = build_tokenizer(**kwargs)
    tok.save_pretrained(str(directory))
    return tok


def load_tokenizer(directory: str | Path):
    """The tokenizer saved in `directory` (a checkpoint, or a tokenizer alone)."""
    import json

    directory = Path(directory)
    settings = directory / "tokenizer_config.json"
    named = json.loads(settings.read_text()).get("tokenizer_class") if settings.is_file() else None
    if named in TOKENIZERS_BACKEND and (directory / "tokenizer.json").is_file():
        # The `tokenizers` library's own class, loaded by name: AutoTokenizer would also import torch and the model
        # classes (~2 s of a driver's start-up, which never runs the model) to pick this same class.
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(directory))
    from transformers import AutoTokenizer, PreTrainedConfig

    config = directory / "config.json"
    kwargs = {}
    if config.is_file() and str(json.loads(config.read_text()).get("model_type", "")).startswith("fbt_"):
        # An FBT's model type is registered by `import rl.model`, which a process that never loads the model (the
        # driver) skips; the tokenizer needs nothing of the model's config (tokenizer_config.json names its class),
        # and an unregistered type would only make transformers warn about it.
        kwargs["config"] = PreTrainedConfig()
    return AutoTokenizer.from_pretrained(str(directory), **kwargs)
