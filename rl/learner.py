"""The former name of rl/policy_update.py, kept so that scripts written against it still import; new code imports
`rl.policy_update`."""
from rl.policy_update import *  # noqa: F403
