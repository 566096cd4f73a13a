"""Config errors name the key and suggest the closest valid one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenmill.errors import ConfigError
from tokenmill.train.config import config_from_dict, load_config

RECIPE = Path(__file__).resolve().parents[2] / "tokenmill" / "recipes" / "train-tiny.yaml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_recipe_loads_with_overrides() -> None:
    cfg = load_config(RECIPE, {"schedule.steps": 7, "dataset.path": "x", "parallel.tp": None})
    assert cfg.schedule.steps == 7 and cfg.dataset.path == "x" and cfg.model.flavour == "gpt2"
    assert cfg.schedule.global_batch_size == 16 and cfg.parallel.precision == "fp32"
    p = cfg.parallel
    assert (p.tp, p.pp, p.dp, p.zero, p.pp_schedule, p.virtual_stages, p.sequence_parallel) == (
        1,
        1,
        1,
        0,
        "1f1b",
        1,
        False,
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("schedule: {global_bach_size: 8}\n", "schedule.global_bach_size: unknown key"),
        ("parallell: {tp: 2}\n", "parallell: unknown key `parallell` (did you mean `parallel`?)"),
        ("model: {preset: tiny, n_layer: 3}\n", "unknown model key `n_layer` (did you mean `n_layers`?)"),
        ("model: tinny\n", "unknown preset `tinny` (did you mean `tiny`?); presets: "),
        (
            "parallel: {precision: bf61}\n",
            "parallel.precision: must be one of fp32, bf16, got 'bf61' (did you mean `bf16`?)",
        ),
        ("schedule: {steps: many}\n", "schedule.steps: expected an integer, got 'many'"),
        ("optimizer: {lr: fast}\n", "optimizer.lr: expected a number"),
        ("schedule: {global_batch_size: 10, micro_batch_size: 4}\n", "schedule.global_batch_size: 10 is not divisible"),
        ("schedule: {global_batch_size: 16, micro_batch_size: 4, rampup_batch_size: [6, 4, 100]}\n", "multiples of"),
        ("schedule: {rampup_batch_size: [8, 4]}\n", "expected [start, increment, ramp-up samples]"),
        ("dataset: {seq_len: 4096}\n", "exceeds the model's max_seq_len"),
        ("parallel: {zero: 4}\n", "parallel.zero: must be 0, 1, 2 or 3"),
        ("model: {preset: tiny, hidden: 66}\n", "model.hidden: 66 is not divisible by n_heads"),
        ("- a\n- b\n", "expected a mapping"),
        ("parallel: {pp_schedule: interleaved}\n", "parallel.virtual_stages"),
    ],
)
def test_config_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert message in str(info.value)
    assert str(tmp_path / "c.yaml") in str(info.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_yaml_scientific_notation_without_dot(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "optimizer: {lr: 3e-4, min_lr: 3e-5}\n"))
    assert cfg.optimizer.lr == 3e-4 and cfg.optimizer.min_lr == 3e-5


@pytest.mark.parametrize(
    "text, message",
    [
        ("lr: 3.0e-4\n", "1: lr: moved; write optimizer.lr"),
        ("model: tiny\nsteps: 4\n", "2: steps: moved; write schedule.steps"),
        ("data: shard\n", "1: data: moved; write dataset.path"),
        ("lr_warmup_steps: 2\n", "1: lr_warmup_steps: moved; write schedule.warmup_steps"),
        ("save_interval: 5\n", "1: save_interval: moved; write checkpoint.interval"),
    ],
)
def test_old_flat_key_names_its_new_place(tmp_path: Path, text: str, message: str) -> None:
    # A flat key is an error even where a command-line flag sets the same nested key.
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), {"schedule.steps": 3})
    assert str(info.value) == f"{tmp_path / 'c.yaml'}:{message}"


@pytest.mark.parametrize(
    "text, message",
    [
        ("model: tiny\nschedule:\n  steps: 10\n  stepz: 3\n", "4: schedule.stepz: unknown key `stepz`"),
        ("model: tiny\n\nparallel:\n  tp: 1\n  zero: 7\n", "5: parallel.zero: must be 0, 1, 2 or 3, got 7"),
        ("model: tiny\noptimizer: {lr: fast}\n", "2: optimizer.lr: expected a number, got 'fast'"),
    ],
)
def test_a_problem_is_one_line_naming_the_file_and_its_line(tmp_path: Path, text: str, message: str) -> None:
    """An unknown key, a cross-field check and a bad value, each at its line of the file."""
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert str(info.value).startswith(f"{tmp_path / 'c.yaml'}:{message}") and "\n" not in str(info.value)


def test_nested_config_round_trips() -> None:
    cfg = load_config(RECIPE)
    assert config_from_dict(cfg.to_dict()).to_dict() == cfg.to_dict()
