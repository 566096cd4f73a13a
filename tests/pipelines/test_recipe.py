"""Recipes: validation with located errors, the step plan, selection, fingerprints (no Dask)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tokenmill.errors import TokenmillError
from tokenmill.pipelines.recipe import RecipeError, load_recipe, parse_recipe
from tokenmill.pipelines.runner import format_plan
from tokenmill.pipelines.step_graph import build_plan, select
from tokenmill.pipelines.steps import blend_weights

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    data = tmp_path / "a.jsonl"
    data.write_text(json.dumps({"text": "hello world " * 20}) + "\n")
    return data


GOOD = """
name: t
sources:
  - {name: a, path: a.jsonl}
  - {name: b, path: a.jsonl}
curate:
  - stage: normalize
  - stage: langid
    sources: [a]
    options: {languages: [en], min_score: 0.5}
tokenize: {vocab_size: 300}
blend:
  - {source: a, weight: 2}
  - {source: b, epochs: 1.5}
"""


def recipe_tiny() -> dict:
    import yaml

    return yaml.safe_load((REPO / "tokenmill" / "recipes" / "train-tiny.yaml").read_text())


def problems_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(RecipeError) as info:
        load_recipe(write(tmp_path, text))
    return str(info.value)


def test_good_recipe_plans_every_step(tmp_path, corpus):
    recipe = load_recipe(write(tmp_path, GOOD))
    steps = build_plan(recipe, tmp_path / "work")
    assert [s.name for s in steps] == [
        "ingest.a",
        "curate.a.normalize",
        "curate.a.langid",
        "ingest.b",
        "curate.b.normalize",
        "tokenize.tokenizer",
        "tokenize.encode.a",
        "tokenize.encode.b",
        "tokenize.blend",
    ]
    by = {s.name: s for s in steps}
    assert by["tokenize.encode.a"].deps == ["curate.a.langid", "tokenize.tokenizer"]
    assert by["tokenize.encode.b"].deps == ["curate.b.normalize", "tokenize.tokenizer"]
    assert by["ingest.a"].config["paths"] == [str(corpus)]


def test_unknown_option_names_key_line_and_suggestion(tmp_path, corpus):
    text = GOOD.replace("min_score: 0.5", "min_scor: 0.5")
    message = problems_of(tmp_path, text)
    assert "curate[1].options.min_scor (line 10)" in message
    assert "did you mean `min_score`?" in message


def test_unknown_top_level_and_nested_keys(tmp_path, corpus):
    text = GOOD.replace("tokenize: {vocab_size: 300}", "tokenise: {vocab_size: 300}").replace(
        "name: t", "name: t\nsoruces_extra: 1"
    )
    message = problems_of(tmp_path, text)
    assert "unknown key `tokenise` (did you mean `tokenize`?)" in message
    assert "soruces_extra" in message
    # All problems are reported at once: the blend now lacks its tokenize section too.
    assert message.count("\n  - ") >= 2


def test_wrong_type_and_bad_value(tmp_path, corpus):
    message = problems_of(tmp_path, GOOD.replace("vocab_size: 300", "vocab_size: lots"))
    assert "tokenize.vocab_size (line 11): expected an integer, got 'lots'" in message
    message = problems_of(tmp_path, GOOD.replace("min_score: 0.5", "min_score: high"))
    assert "curate[1].options.min_score (line 10): expected a number, got 'high'" in message
    message = problems_of(tmp_path, GOOD.replace("vocab_size: 300", "vocab_size: 100"))
    assert "tokenize.vocab_size (line 11): must be at least 260, got 100" in message


def test_problems_of_every_section_are_reported_together_in_one_style(tmp_path, corpus):
    # A schema problem (tokenize) no longer hides the checks of the sections that passed (curate,
    # blend); all are listed in the file's order.
    text = (
        GOOD.replace("vocab_size: 300", "vocab_sise: 300")
        .replace("min_score: 0.5", "min_scor: 0.5")
        .replace("{source: b, epochs: 1.5}", "{source: bb, epochs: 1.5}")
    )
    assert problems_of(tmp_path, text).splitlines() == [
        f"{tmp_path / 'recipe.yaml'}: 3 problems in the recipe:",
        "  - curate[1].options.min_scor (line 10): unknown option `min_scor` for stage langid "
        "(did you mean `min_score`?); options: languages, min_score, model",
        "  - tokenize.vocab_sise (line 11): unknown key `vocab_sise` (did you mean `vocab_size`?)",
        "  - blend[1].source (line 14): no source named `bb` (did you mean `b`?)",
    ]


def test_a_bad_item_of_a_list_section_leaves_the_other_items_checked(tmp_path, corpus):
    # curate[0] and blend[0] fail the schema; the checks of curate[1] and blend[1] against the
    # other sections still run, each problem named by the item's place in the file.
    text = (
        GOOD.replace("  - stage: normalize", "  - stage: normalize\n    optionz: {}")
        .replace("sources: [a]", "sources: [c]")
        .replace("min_score: 0.5", "min_scor: 0.5")
        .replace("{source: a, weight: 2}", "{source: a, weight: 2, epochs: 1}")
        .replace("{source: b, epochs: 1.5}", "{source: bb, epochs: 1.5}")
    )
    assert problems_of(tmp_path, text).splitlines()[1:] == [
        "  - curate[0].optionz (line 8): unknown key `optionz` (did you mean `options`?)",
        "  - curate[1].sources[0] (line 10): no source named `c`",
        "  - curate[1].options.min_scor (line 11): unknown option `min_scor` for stage langid "
        "(did you mean `min_score`?); options: languages, min_score, model",
        "  - blend[0] (line 14): give exactly one of `weight` or `epochs`",
        "  - blend[1].source (line 15): no source named `bb` (did you mean `b`?)",
    ]


def test_unknown_stage_and_source_names(tmp_path, corpus):
    text = (
        GOOD.replace("stage: normalize", "stage: normalise")
        .replace("sources: [a]", "sources: [c]")
        .replace("{source: b, epochs: 1.5}", "{source: bb, epochs: 1.5}")
    )
    message = problems_of(tmp_path, text)
    assert "curate[0].stage (line 7): unknown stage `normalise` (did you mean `normalize`?)" in message
    assert "curate[1].sources[0]" in message and "no source named `c`" in message
    assert "blend[1].source" in message and "no source named `bb` (did you mean `b`?)" in message


def test_missing_path_is_an_error_before_anything_runs(tmp_path):
    message = problems_of(tmp_path, GOOD)  # a.jsonl was not created
    assert "sources[0].path (line 4): path not found" in message
    # ... and only a warning for a dry run of a template
    recipe = load_recipe(tmp_path / "recipe.yaml", check_paths="warn")
    assert any("sources[0].path" in w for w in recipe.warnings)


def test_blend_needs_exactly_one_of_weight_or_epochs(tmp_path, corpus):
    message = problems_of(tmp_path, GOOD.replace("{source: a, weight: 2}", "{source: a, weight: 2, epochs: 1}"))
    assert "blend[0]" in message and "exactly one of `weight` or `epochs`" in message


def test_train_config_checked_by_the_trainer_schema(tmp_path, corpus):
    text = GOOD + "train:\n  config: {stepz: 3}\n"
    message = problems_of(tmp_path, text)
    assert "train.config" in message and "stepz" in message


def test_train_layout_checked_by_the_trainer_layout_checks(tmp_path, corpus):
    # A section written in `train:` and one inside `train.config` get the same check, each
    # located at the key that sets the value.
    message = problems_of(tmp_path, GOOD + "train:\n  config: {model: {preset: tiny}}\n  parallel: {zero: 5}\n")
    assert message.endswith("train.parallel.zero (line 17): must be 0, 1, 2 or 3, got 5")
    message = problems_of(tmp_path, GOOD + "train:\n  config: {parallel: {zero: 4}}\n")
    assert message.endswith("train.config.parallel.zero (line 16): must be 0, 1, 2 or 3, got 4")
    # `train.parallel` is merged over `train.config.parallel`: its value is the one checked.
    message = problems_of(tmp_path, GOOD + "train:\n  config: {parallel: {zero: 1, dp: 2}}\n  parallel: {zero: 7}\n")
    assert message.endswith("train.parallel.zero (line 17): must be 0, 1, 2 or 3, got 7")


@pytest.mark.parametrize(
    "train, message",
    [
        ("  config: tiny\n  dp: 2\n", "train.dp (line 17): moved; write train.parallel.dp"),
        ("  config: tiny\n  steps: 20\n", "train.steps (line 17): moved; write train.schedule.steps"),
        # one table of moved keys: those of the flat training config, also in `train:` itself
        ("  config: tiny\n  lr: 1.0e-3\n", "train.lr (line 17): moved; write train.optimizer.lr"),
        ("  config: {model: tiny, lr: 1.0e-3}\n", "train.config.lr (line 16): moved; write optimizer.lr"),
    ],
)
def test_old_flat_train_key_is_one_line_naming_its_new_place(tmp_path, corpus, capsys, train, message):
    path = write(tmp_path, GOOD + "train:\n" + train)
    assert problems_of(tmp_path, GOOD + "train:\n" + train) == f"{path}: {message}"
    from tokenmill.cli import main

    assert main(["run", str(path), "--dry-run"]) == 1
    assert capsys.readouterr().err == f"tokenmill: error: {path}: {message}\n"


def test_train_sections_merge_over_the_config(tmp_path, corpus):
    path = write(tmp_path, GOOD + "train:\n  config: tiny\n  parallel: {dp: 2, cp: 2}\n  schedule: {steps: 20}\n")
    recipe = load_recipe(path)
    data = recipe.train_config_dict()
    # The bundled config's other keys stay: only the keys written in `train:` change.
    assert data["schedule"] == {**recipe_tiny()["schedule"], "steps": 20}
    assert data["parallel"] == {**recipe_tiny()["parallel"], "dp": 2, "cp": 2}
    assert recipe.train_layout() == {"tp": 1, "pp": 1, "dp": 2, "cp": 2, "zero": 0} and recipe.train_world_size() == 4
    (train,) = [s for s in build_plan(recipe, tmp_path / "work") if s.name == "train"]
    assert "dp=2 cp=2" in train.description and "(4 processes)" in train.description


def test_selection_from_until_force(tmp_path, corpus):
    steps = build_plan(load_recipe(write(tmp_path, GOOD)), tmp_path / "work")
    everything = {s.name for s in steps}
    sel = select(steps, None, ["curate"], None)
    assert sel.runnable == {"ingest.a", "curate.a.normalize", "curate.a.langid", "ingest.b", "curate.b.normalize"}
    sel = select(steps, ["langid"], None, None)
    assert (
        sel.forced
        == sel.runnable
        == {"curate.a.langid", "tokenize.tokenizer", "tokenize.encode.a", "tokenize.encode.b", "tokenize.blend"}
    )
    sel = select(steps, None, None, ["tokenize.encode.b"])
    assert sel.runnable == everything and sel.forced == {"tokenize.encode.b", "tokenize.blend"}
    with pytest.raises(TokenmillError, match="did you mean `langid`"):
        select(steps, ["langidd"], None, None)


def test_fingerprint_changes_reach_exactly_the_dependents(tmp_path, corpus):
    before = {s.name: s.fingerprint for s in build_plan(load_recipe(write(tmp_path, GOOD)), tmp_path / "w")}
    again = {s.name: s.fingerprint for s in build_plan(load_recipe(write(tmp_path, GOOD)), tmp_path / "w")}
    assert before == again
    changed = GOOD.replace("min_score: 0.5", "min_score: 0.6")
    after = {s.name: s.fingerprint for s in build_plan(load_recipe(write(tmp_path, changed)), tmp_path / "w")}
    differ = {name for name in before if before[name] != after[name]}
    assert differ == {
        "curate.a.langid",
        "tokenize.tokenizer",
        "tokenize.encode.a",
        "tokenize.encode.b",
        "tokenize.blend",
    }


def test_blend_weights_from_weights_and_epochs():
    tokens = {"a": 100, "b": 300}
    assert blend_weights([{"source": "a", "weight": 3}, {"source": "b", "weight": 1}], tokens) == {"a": 0.75, "b": 0.25}
    # epochs: shares proportional to epochs x tokens
    w = blend_weights([{"source": "a", "epochs": 3}, {"source": "b", "epochs": 1}], tokens)
    assert w == pytest.approx({"a": 0.5, "b": 0.5})


def test_demo_recipe_validates_with_and_without_eval_data(tmp_path, shared_data):
    from tokenmill.pipelines.cli import demo_overrides, demo_recipe_text

    recipe = parse_recipe(demo_recipe_text(), origin="demo.yaml", base_dir=tmp_path, overrides=demo_overrides(None))
    assert recipe.eval.tasks == [] and all(c.stage != "decontaminate" for c in recipe.curate)
    recipe = parse_recipe(
        demo_recipe_text(), origin="demo.yaml", base_dir=tmp_path, overrides=demo_overrides(str(shared_data / "eval"))
    )
    assert recipe.train_layout()["dp"] == 2 and recipe.eval.tasks and recipe.eval.skip_missing
    assert any(c.stage == "decontaminate" for c in recipe.curate)


def test_mtnlg_dry_run_prints_the_plan_and_layout(tmp_path, capsys):
    from tokenmill.cli import main

    assert main(["run", str(REPO / "recipes" / "mtnlg.yaml"), "--workdir", str(tmp_path / "w"), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "tokenmill: WARNING: sources[0].path" in err  # the template's corpora are not on this machine
    assert "ingest.books3" in out and "curate.cc_2020_50.fuzzy_dedup" in out and "tokenize.blend" in out
    assert "tp=8 x pp=35 x dp=16 = 4480 process(es)" in out
    assert "105 layers x hidden 20480 x 128 heads" in out
    assert "planner estimate on 4480 GPU(s)" in out and "bubble" in out
    assert not (tmp_path / "w").exists()  # a dry run writes nothing


def test_dry_run_plan_marks_up_to_date_steps(tmp_path, corpus):
    recipe = load_recipe(write(tmp_path, GOOD))
    plan = format_plan(recipe, tmp_path / "work", None, ["ingest.a"], None)
    assert "ingest.a  [will run]" in plan and "curate.a.normalize  [not selected]" in plan


def test_bad_choice_suggests_the_nearest(tmp_path, corpus):
    message = problems_of(tmp_path, GOOD.replace("{name: a, path: a.jsonl}", "{name: a, path: a.jsonl, format: jsnol}"))
    assert "sources[0].format (line 4)" in message and "(did you mean `jsonl`?)" in message


def test_demo_dry_run_plans_every_stage(tmp_path, shared_data, capsys):
    from tokenmill.cli import main

    code = main(["demo", "--workdir", str(tmp_path / "d"), "--eval-data", str(shared_data / "eval"), "--dry-run"])
    assert code == 0
    out = capsys.readouterr().out
    for step in (
        "ingest.pydocs",
        "curate.pydocs.normalize",
        "curate.pydocs.langid",
        "curate.pydocs.filter",
        "curate.pydocs.exact_dedup",
        "curate.pydocs.fuzzy_dedup",
        "curate.pydocs.decontaminate",
        "tokenize.tokenizer",
        "tokenize.encode.pydocs",
        "tokenize.blend",
        "train",
        "eval",
    ):
        assert f". {step}  [will run]" in out
    assert "tp=1 x pp=1 x dp=2 = 2 process(es)" in out
    assert not (tmp_path / "d").exists()


CLASSIFIED = """
sources:
  - {name: web, path: a.jsonl}
  - {name: wiki, path: a.jsonl}
classifiers:
  - {name: quality, positive: [wiki], negative: [web], options: {epoch: 3}}
curate:
  - stage: normalize
  - stage: classify
    sources: [web]
    options: {classifier: quality, pareto_alpha: 9}
"""


def test_classifier_trained_in_the_run_comes_before_the_stage_using_it(tmp_path, corpus):
    steps = build_plan(load_recipe(write(tmp_path, CLASSIFIED)), tmp_path / "w")
    names = [s.name for s in steps]
    assert names == [
        "ingest.web",
        "curate.web.normalize",
        "ingest.wiki",
        "curate.wiki.normalize",
        "classifier.quality",
        "curate.web.classify",
    ]
    by = {s.name: s for s in steps}
    assert by["classifier.quality"].deps == ["ingest.wiki", "ingest.web"]
    assert by["curate.web.classify"].deps == ["curate.web.normalize", "classifier.quality"]
    # The model file is found in the work directory at run time, so its path is not in the fingerprint.
    assert by["curate.web.classify"].config["classifier"] == "quality"
    assert "model" not in by["curate.web.classify"].config["options"]
    assert by["curate.web.classify"].inputs[-1] == str(tmp_path / "w" / "classifiers" / "quality" / "model.bin")


def test_classifier_names_and_options_are_checked(tmp_path, corpus):
    text = (
        CLASSIFIED.replace("classifier: quality", "classifier: qualty")
        .replace("epoch: 3", "epochs: 3")
        .replace("negative: [web]", "negative: [webb]")
    )
    message = problems_of(tmp_path, text)
    assert "curate[1].options.classifier" in message and "(did you mean `quality`?)" in message
    assert "classifiers[0].options.epochs" in message and "(did you mean `epoch`?)" in message
    assert "classifiers[0].negative[0]" in message and "no source named `webb` (did you mean `web`?)" in message


def test_a_bad_source_or_classifier_leaves_the_checks_that_do_not_depend_on_it(tmp_path, corpus):
    # sources[0] and classifiers[0] fail the schema; their names are read all the same, so a
    # mention of them is no problem, and the other items and sections are checked against them.
    text = (
        CLASSIFIED.replace("{name: web, path: a.jsonl}", "{name: web, path: a.jsonl, formatt: jsonl}")
        .replace("options: {epoch: 3}}", "optionz: {epoch: 3}}\n  - {name: other, positive: [wikki], negative: [web]}")
        .replace("sources: [web]", "sources: [web, webz]")
        .replace("pareto_alpha: 9", "pareto_alpah: 9")
    )
    assert problems_of(tmp_path, text).splitlines()[1:] == [
        "  - sources[0].formatt (line 3): unknown key `formatt` (did you mean `format`?)",
        "  - classifiers[0].optionz (line 6): unknown key `optionz` (did you mean `options`?)",
        "  - classifiers[1].positive[0] (line 7): no source named `wikki` (did you mean `wiki`?)",
        "  - curate[1].sources[1] (line 11): no source named `webz` (did you mean `web`?)",
        "  - curate[1].options.pareto_alpah (line 12): unknown option `pareto_alpah` for stage classify"
        " (did you mean `pareto_alpha`?); options: model, threshold, pareto_alpha, seed, lowercase",
    ]
    # A source without a name: any name mentioned may be its, so no mention is called unknown;
    # the checks that need no source's name still run.
    nameless = text.replace("{name: web, path: a.jsonl, formatt: jsonl}", "{path: a.jsonl}")
    assert problems_of(tmp_path, nameless).splitlines()[1:] == [
        "  - sources[0].name (line 3): required key is missing",
        "  - classifiers[0].optionz (line 6): unknown key `optionz` (did you mean `options`?)",
        "  - curate[1].options.pareto_alpah (line 12): unknown option `pareto_alpah` for stage classify"
        " (did you mean `pareto_alpha`?); options: model, threshold, pareto_alpha, seed, lowercase",
    ]


def test_bundled_recipes_run_by_name_from_any_directory(tmp_path, monkeypatch, capsys):
    """`tokenmill run mtnlg --dry-run` after a plain install, from a directory without recipes/."""
    from tokenmill.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["run", "mtnlg", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "training layout: tp=8 x pp=35 x dp=16 = 4480 process(es)" in out
    # The template's relative data paths mean the user's directory, reported as missing there.
    assert f"path not found: {tmp_path / 'data' / 'pile' / 'books3'}" in err
    assert main(["run", "mtnlgg"]) == 1
    err = capsys.readouterr().err
    assert "bundled: common-crawl, demo, mtnlg" in err and "Traceback" not in err


def test_train_config_may_name_a_bundled_config(tmp_path, corpus):
    from tokenmill.pipelines.dry_run_training import describe_layout
    from tokenmill.recipes import bundled_recipes

    path = tmp_path / "r.yaml"
    path.write_text(f"""
sources:
  - {{name: wiki, path: {corpus}}}
tokenize: {{vocab_size: 300}}
blend:
  - {{source: wiki, weight: 1}}
train:
  config: tiny
  parallel: {{dp: 2}}
""")
    recipe = load_recipe(path)
    assert recipe.train_config_file() == bundled_recipes("train-")["tiny"]
    assert recipe.train_config_dict()["model"]["preset"] == "tiny"
    assert any("dp=2" in line for line in describe_layout(recipe))
    path.write_text(path.read_text().replace("config: tiny", "config: tinyy.yaml"))
    with pytest.raises(RecipeError, match="train.config"):
        load_recipe(path)


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_dry_run_of_a_cpu_run_speaks_of_processes_not_gpus(tmp_path, corpus, capsys, monkeypatch, device):
    """A toy model trained on the CPU: memory per process in host memory, in MiB, at fp32, and
    no 80 GiB GPUs or TFLOP/s; on a machine with CUDA, `auto` is planned on its own GPU."""
    import torch

    from tokenmill.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = tmp_path / "r.yaml"
    path.write_text(f"""
sources:
  - {{name: wiki, path: {corpus}}}
tokenize: {{vocab_size: 300}}
blend:
  - {{source: wiki, weight: 1}}
train:
  parallel: {{dp: 2}}
  config:
    model: {{preset: tiny}}
    schedule: {{global_batch_size: 16}}
    parallel: {{device: {device}, precision: fp32}}
""")
    assert main(["run", str(path), "--workdir", str(tmp_path / "w"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    training = out[out.index("training layout:") :]
    assert "memory estimate on the CPU, per process (2 process(es), dp=2, fp32): weights" in training
    assert " MiB" in training and "in all" in training
    assert "GPU" not in training and "GiB" not in training and "TFLOP" not in training
    if device == "auto":
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"total_memory": 24 * 2**30}))
        assert main(["run", str(path), "--workdir", str(tmp_path / "w"), "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert "planner estimate on 2 GPU(s) of 24 GiB (this machine's) (dp=2)" in out


@pytest.mark.parametrize("name", ["../../outside", "/tmp/outside", "a/../../outside"])
def test_a_recipe_name_never_puts_the_work_directory_outside(tmp_path, corpus, monkeypatch, capsys, name):
    """The default work directory is NAME-work in the current directory: a name that would move
    it elsewhere is refused in one line before anything runs, and nothing is created."""
    from tokenmill.cli import main

    recipe = write(tmp_path, GOOD.replace("name: t", f"name: {json.dumps(name)}"))
    here = tmp_path / "a" / "b"
    here.mkdir(parents=True)
    monkeypatch.chdir(here)
    before = sorted(tmp_path.rglob("*"))
    assert main(["run", str(recipe)]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokenmill: error: ") and "outside the current directory" in lines[0]
    assert sorted(tmp_path.rglob("*")) == before and not Path("/tmp/outside-work").exists()


WEB_PASSES = """
sources:
  - {name: crawl, path: a.jsonl}
  - {name: web, path: a.jsonl}
  - {name: wiki, path: a.jsonl}
classifiers:
  - {name: quality, positive: [wiki], negative: [web]}
curate:
  - stage: extract
    sources: [crawl, web]
  - stage: langid
  - stage: classify
    options: {classifier: quality}
"""


def test_ingest_leads_a_pass_that_starts_with_extract_unless_a_classifier_reads_it(tmp_path, corpus):
    by = {s.name: s for s in build_plan(load_recipe(write(tmp_path, WEB_PASSES)), tmp_path / "w")}
    # crawl's HTML goes from ingest to extract in memory; ingest's output (what it writes) is in its fingerprint.
    assert by["ingest.crawl"].chain == ["ingest.crawl", "curate.crawl.extract", "curate.crawl.langid"]
    assert by["curate.crawl.langid"].chain == by["ingest.crawl"].chain and "chain" in by["ingest.crawl"].config
    # web trains the classifier, which reads its ingested documents; wiki's first step is not extract.
    assert by["ingest.web"].chain == [] and by["curate.web.extract"].chain == [
        "curate.web.extract",
        "curate.web.langid",
    ]
    assert by["ingest.wiki"].chain == [] and "chain" not in by["ingest.wiki"].config
    unfused = WEB_PASSES + "chain: {fuse: false}\n"
    assert not build_plan(load_recipe(write(tmp_path, unfused)), tmp_path / "w")[0].chain
