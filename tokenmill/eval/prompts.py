"""k-shot prompts and loglikelihood requests, built as lm-evaluation-harness 0.4.x builds them.

The harness (`ConfigurableTask.fewshot_context`, `build_qa_turn`, `construct_requests`) renders a
few-shot example as `question + " " + answer + "\\n\\n"` and the evaluated document as its bare
question; a multiple-choice document becomes one (context, " " + choice) request per choice, a
multiple-input one (WinoGrande) one (context_i, " " + target) request per context.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from tokenmill.eval.tasks.base import Doc, Task

FEWSHOT_SEED = 1234  # the harness's default `fewshot_random_seed`


class FewshotSampler:
    """The harness's default `ContextSampler`: one `random.Random(seed)` drawn from doc after doc."""

    def __init__(self, pool: Sequence[Doc], seed: int = FEWSHOT_SEED) -> None:
        self.pool = list(pool)
        self.rnd = random.Random(seed)

    def sample(self, n: int, eval_doc: Doc | None = None) -> list[Doc]:
        if n == 0:
            return []
        if not self.pool:
            raise ValueError("no documents to draw few-shot examples from")
        if not eval_doc:
            return self.rnd.sample(self.pool, n)
        # Draw one extra so that dropping the evaluated document still leaves n.
        res = [x for x in self.rnd.sample(self.pool, n + 1) if x != eval_doc][:n]
        if len(res) < n:  # the pool held several copies of the evaluated document
            res = self.rnd.sample([x for x in self.pool if x != eval_doc], n)
        return res


def render_example(question: str, answer: str | None, target_delimiter: str, fewshot_delimiter: str) -> str:
    """One solved example (build_qa_turn with an answer)."""
    if answer is None or answer == "":
        return question
    return question + target_delimiter + answer + fewshot_delimiter


@dataclass(frozen=True)
class Request:
    """One loglikelihood query: score `continuation` after `context`."""

    doc_index: int
    choice_index: int
    context: str
    continuation: str


def fewshot_prefix(task: Task, examples: Sequence[Doc]) -> str:
    parts = []
    for example in examples:
        q, a = task.fewshot_answer(example)
        parts.append(render_example(q, a, task.target_delimiter, task.fewshot_delimiter))
    return "".join(parts)


def build_requests(
    task: Task, docs: Sequence[Doc], shots: int, fewshot_pool: Sequence[Doc] | None, seed: int = FEWSHOT_SEED
) -> list[list[Request]]:
    """Requests per document, in document order (the sampler's draws depend on that order)."""
    sampler = FewshotSampler(fewshot_pool or [], seed) if shots > 0 else None
    out: list[list[Request]] = []
    for i, doc in enumerate(docs):
        prefix = ""
        if sampler is not None:
            eval_doc = doc if task.fewshot_excludes_eval_doc else None
            prefix = fewshot_prefix(task, sampler.sample(shots, eval_doc))
        out.append(doc_requests(task, i, doc, prefix))
    return out


def doc_requests(task: Task, index: int, doc: Doc, prefix: str) -> list[Request]:
    delim = task.target_delimiter
    if task.output_type == "loglikelihood":
        text, target = task.doc_to_text(doc), task.doc_to_target(doc)
        assert isinstance(text, str) and isinstance(target, str)
        return [Request(index, 0, prefix + text, target)]
    choices = task.doc_to_choice(doc)
    assert choices is not None, f"task {task.name}: multiple choice without choices"
    if task.multiple_input:
        target = task.doc_to_target(doc)
        return [Request(index, j, prefix + ctx, f"{delim}{target}") for j, ctx in enumerate(choices)]
    text = task.doc_to_text(doc)
    assert isinstance(text, str)
    return [Request(index, j, prefix + text, f"{delim}{choice}") for j, choice in enumerate(choices)]
