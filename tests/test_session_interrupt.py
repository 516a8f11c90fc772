"""A second Ctrl-C that lands inside Ray's `ray.wait` reaches the session wrapped in a SystemError (Ray's Cython
checks for signals there); the job must still stop at once with its one line and the signal's exit code, not a
traceback."""

import signal

from actors.cli.session import Interrupted, Session, interruption
from rl.config import load_config
from rl.train.run_dir import RunDir


def _wrapped_interrupt() -> SystemError:
    """What `ray.wait` raises when the signal handler raised `Interrupted` inside it."""
    try:
        try:
            raise Interrupted(signal.SIGINT)
        except Interrupted as inner:
            raise SystemError("<cyfunction CoreWorker.wait> returned a result with an exception set") from inner
    except SystemError as outer:
        return outer


def test_an_interrupt_wrapped_by_an_extension_is_found():
    wrapped = _wrapped_interrupt()
    assert isinstance(interruption(wrapped), Interrupted)
    assert interruption(RuntimeError("unrelated")) is None
    assert interruption(None) is None


def test_the_session_stops_at_once_on_an_interrupt_wrapped_by_ray_wait(tmp_path, capsys):
    cfg = load_config("configs/tiny.yaml", [f"train.run_dir={tmp_path / 'run'}"])
    session = Session(cfg, RunDir(str(tmp_path / "run")), True, 0.0)
    with session:
        raise _wrapped_interrupt()  # the with-block swallows it: a stop, not a crash
    assert session.exit_code() == 128 + signal.SIGINT
    err = capsys.readouterr().err
    assert "SIGINT received: stopped at once" in err
