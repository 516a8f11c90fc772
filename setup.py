"""Which packages `pip install .` builds: fbrl's code (rl, rollout, rewards, actors) and its data package.

The data package `fbrl_data` is made from the repository's own configs/ and checkpoints/ (they stay where the
commands and docs name them): `fbrl_data/configs/*.yaml` and `fbrl_data/checkpoints/<name>/*` in site-packages.
rl.config.loading.package_root() finds it there when fbrl does not run from a source checkout (docs/INSTALL.md).
Everything else about the project is in pyproject.toml.
"""

from setuptools import find_packages, setup

DATA = {"fbrl_data.configs": "configs", "fbrl_data.checkpoints": "checkpoints"}

setup(
    packages=find_packages(include=["rl*", "rollout*", "rewards*", "actors*"]) + list(DATA),
    package_dir=DATA,
    package_data={"*": ["*.yaml", "*.json"], "fbrl_data.configs": ["*.yaml"], "fbrl_data.checkpoints": ["*/*"]},
)
