"""Studies built on fbrl, run from the repository root (`python -m examples.NAME --help`): the likelihood
estimators compared on one job (study_estimators) and the state-tracking sweep (track_sweep); docs/STUDY.md."""
