"""Every config the repository ships loads through the project's own loader (`rl.config.load_config`): the
configs/*.yaml recipes, each committed checkpoint's pretrain_config.yaml (the config that trained it) and the
"Config used" YAML block of its README. A schema change that retires or retypes a key these files use fails here,
not in the hands of a user reproducing a checkpoint (the committed checkpoints once carried the retired
`likelihood.micro_batch_size`, which load_config refuses)."""

import re

import pytest
import yaml

from rl.config import load_config
from rl.config.loading import INPUT_PATH_KEYS, PACKAGE_ROOT, UNREAD_SECTIONS

RECIPES = sorted(PACKAGE_ROOT.glob("configs/*.yaml"))
CHECKPOINT_CONFIGS = sorted(PACKAGE_ROOT.glob("checkpoints/*/pretrain_config.yaml"))
CARDS = sorted(PACKAGE_ROOT.glob("checkpoints/*/README.md"))


def _card_blocks(card):
    """The YAML blocks of a checkpoint card that hold a whole config (a `model:` section at the top)."""
    blocks = re.findall(r"```yaml\n(.*?)```", card.read_text(), re.S)
    return [b for b in blocks if re.match(r"model:\s*$", b, re.M)]


CARD_BLOCKS = [(card, i, block) for card in CARDS for i, block in enumerate(_card_blocks(card))]


def _rel(p):
    return str(p.relative_to(PACKAGE_ROOT))


def _assert_loads_as_written(path, text):
    """load_config accepts the file, and every value the file sets is the loaded config's value (the loader
    neither refuses a key nor reinterprets one; keys the file leaves out take their defaults). Input paths are left
    out: the loader resolves those of the package's own configs against the package root, on purpose."""
    loaded = load_config(path).to_dict()
    for key in INPUT_PATH_KEYS:
        section, name = key.split(".")
        loaded[section].pop(name)
    _assert_sets(yaml.safe_load(text), loaded, "")


def _assert_sets(written, loaded, key):
    """`written` (the file's data) is `loaded` (plain data), or a part of it: mappings may leave keys out."""
    if isinstance(written, dict) and isinstance(loaded, dict):
        for k, v in written.items():
            if f"{key}.{k}".lstrip(".") not in INPUT_PATH_KEYS and not (not key and k in UNREAD_SECTIONS):
                _assert_sets(v, loaded[k], f"{key}.{k}".lstrip("."))
    elif isinstance(written, list) and isinstance(loaded, list):
        assert len(written) == len(loaded), key
        for i, (w, v) in enumerate(zip(written, loaded)):
            _assert_sets(w, v, f"{key}[{i}]")
    else:
        assert written == loaded, f"{key}: the file says {written!r}, the loaded config {loaded!r}"


def test_the_repository_ships_configs_and_checkpoints():
    """The globs below find something: an empty parametrization would pass silently."""
    assert RECIPES and CHECKPOINT_CONFIGS and CARD_BLOCKS
    checkpoints = {p.parent for p in PACKAGE_ROOT.glob("checkpoints/*/config.json")}
    assert checkpoints == {p.parent for p in CHECKPOINT_CONFIGS}, "a committed checkpoint without pretrain_config.yaml"


@pytest.mark.parametrize("path", RECIPES + CHECKPOINT_CONFIGS, ids=_rel)
def test_shipped_config_loads(path):
    _assert_loads_as_written(path, path.read_text())


@pytest.mark.parametrize("card,index,block", CARD_BLOCKS, ids=[f"{_rel(c)}[{i}]" for c, i, _ in CARD_BLOCKS])
def test_checkpoint_card_config_loads(tmp_path, card, index, block):
    path = tmp_path / f"{card.parent.name}-card-{index}.yaml"
    path.write_text(block)
    _assert_loads_as_written(path, block)


def test_the_one_gpu_recipe_passes_the_load_time_checks_and_colocates_over_ipc():
    """configs/gpu_1x.yaml (untested on a GPU here): its engine, GPU shares, colocation and transport pass the
    combination checks and resolve to CUDA IPC with the engine on the learner's node."""
    from actors.cli.preflight import check_combinations
    from actors.weight_sync import resolve_transport

    cfg = load_config(PACKAGE_ROOT / "configs" / "gpu_1x.yaml")
    check_combinations(cfg)

    class OneNode:
        rollout_nodes = learner_nodes = ["gpu-node"]

    assert resolve_transport(cfg, OneNode()) == ("ipc", "rollout.weight_sync")
    assert cfg.ray.colocate and cfg.rollout.num_gpus_per_engine + cfg.learner.num_gpus_per_worker <= 1
    assert cfg.data.task == "hub" and cfg.reward.answer_needed_by() is not None


def test_the_cluster_recipe_passes_the_load_time_checks_and_names_no_file_outside_the_run_tree():
    """configs/gpu_1b.yaml (untested on a GPU here): its combination of engines, learners and transport is accepted,
    its data are Hub ids and its model and run directory live under runs/, where its documented recipe writes."""
    from actors.cli.preflight import check_combinations

    path = PACKAGE_ROOT / "configs" / "gpu_1b.yaml"
    cfg = load_config(path)
    check_combinations(cfg)
    assert cfg.data.task == "hub" and cfg.reward.answer_needed_by() is not None
    written = yaml.safe_load(path.read_text())
    model_path, run_dir = written["model"]["path"], written["train"]["run_dir"]
    assert model_path.startswith("runs/") and run_dir.startswith("runs/")
    assert f"pretrain.out_dir={model_path}" in path.read_text()  # the recipe in its header makes the model
