"""The former name of rl/train/policy_update.py, kept so that scripts written against it still import; new code imports
`rl.train.policy_update`."""

from rl.train.policy_update import *  # noqa: F403
