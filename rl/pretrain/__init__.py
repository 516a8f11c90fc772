"""rl.pretrain — multi-pass pretraining / SFT of an FBT checkpoint (`fbrl pretrain`).

`trainer` (the training loop, validation, checkpoints; the command's `add_arguments` / `run`) and `objective` (the
multi-pass objective and its pass schedule). Importing the package loads nothing.
"""
