"""The benchmarks MT-NLG reported and those data ablations report (ARC, OpenBookQA, Social IQa,
COPA, CommonsenseQA, WSC273), each scored as lm-evaluation-harness 0.4.x scores it."""

from __future__ import annotations

from tokenmill.errors import TokenmillError
from tokenmill.eval.tasks.anli import AnliR1, AnliR2, AnliR3
from tokenmill.eval.tasks.arc import ArcChallenge, ArcEasy
from tokenmill.eval.tasks.base import Doc, MissingDataError, Task
from tokenmill.eval.tasks.boolq import BoolQ
from tokenmill.eval.tasks.commonsense_qa import CommonsenseQA
from tokenmill.eval.tasks.copa import Copa
from tokenmill.eval.tasks.hellaswag import HellaSwag
from tokenmill.eval.tasks.lambada_openai import LambadaOpenAI
from tokenmill.eval.tasks.openbookqa import OpenBookQA
from tokenmill.eval.tasks.piqa import Piqa
from tokenmill.eval.tasks.race import RaceHigh
from tokenmill.eval.tasks.social_iqa import SocialIQa
from tokenmill.eval.tasks.wic import WiC
from tokenmill.eval.tasks.winogrande import WinoGrande
from tokenmill.eval.tasks.wsc273 import Wsc273

MT_NLG_TASKS = (LambadaOpenAI, Piqa, BoolQ, HellaSwag, WinoGrande, RaceHigh, AnliR1, AnliR2, AnliR3, WiC)
ABLATION_TASKS = (ArcEasy, ArcChallenge, OpenBookQA, SocialIQa, Copa, CommonsenseQA, Wsc273)
TASKS: dict[str, type[Task]] = {cls.name: cls for cls in MT_NLG_TASKS + ABLATION_TASKS}
# Names people use for the same tasks (the harness's own names and groups among them).
ALIASES = {
    "race_high": "race",
    "lambada": "lambada_openai",
    "anli": "anli_r1,anli_r2,anli_r3",
    "arc": "arc_easy,arc_challenge",
    "ai2_arc": "arc_easy,arc_challenge",
    "siqa": "social_iqa",
}


def resolve_task_names(names: list[str] | str) -> list[str]:
    """Expand aliases and check names; a bad name lists the valid ones."""
    if isinstance(names, str):
        names = [n for n in names.split(",")]
    out: list[str] = []
    for raw in names:
        name = raw.strip()
        if not name:
            continue
        expanded = ALIASES.get(name, name).split(",")
        for task in expanded:
            if task not in TASKS:
                valid = ", ".join(sorted(TASKS))
                raise TokenmillError(f"unknown task {name!r}; valid tasks: {valid}")
            if task not in out:
                out.append(task)
    if not out:
        raise TokenmillError(f"no task given; valid tasks: {', '.join(sorted(TASKS))}")
    return out


def get_task(name: str) -> Task:
    return TASKS[resolve_task_names([name])[0]]()


__all__ = ["ALIASES", "TASKS", "Doc", "MissingDataError", "Task", "get_task", "resolve_task_names"]
