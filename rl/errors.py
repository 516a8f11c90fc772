"""The one base of fbrl's input errors.

`InputError` (a ValueError) is what a job input that cannot work raises — a config value, a data file, a reward
function, a checkpoint, the run directory — with a message naming it. `fbrl train` prints such an error as one
line and exits with code 2; any other exception is a bug and keeps its traceback.
"""


class InputError(ValueError):
    """A job input that cannot work; the message names it (the config key, the file, the row)."""
