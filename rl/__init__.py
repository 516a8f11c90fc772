"""rl — the model and the learning side of fbrl, with no Ray and no vLLM.

Owns: the full-bandwidth transformer (fusion, multi-pass forward, recurrent step) on Hugging Face backbones,
multi-pass pretraining/SFT, likelihood estimators, the GRPO family as pure functions, batch types, the config
schema, datasets/tasks, and the RL loop written against worker interfaces. Importing `rl` itself loads nothing:
`import rl.model` registers the FBT configs and models with transformers' Auto classes, so `rl.algos`, `rl.config`
and the loop stay importable without transformers.
"""
