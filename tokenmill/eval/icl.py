"""In-context-learning tasks built and scored as llm-foundry builds and scores them (the protocol of
DCLM's CORE), for any model adapter of `tokenmill.eval.models`.

A task file holds one JSON object a line, in llm-foundry's format for its `icl_task_type`:

- `multiple_choice`: `query`, `choices`, `gold`; the choice with the lowest per-token
  perplexity (exp of the mean cross-entropy of its tokens) is the model's answer;
- `schema`: `context_options`, `continuation`, `gold`; the context option after which the shared
  continuation has the lowest per-token perplexity is the answer (partial scoring);
- `language_modeling`: `context`, `continuation`; correct when every continuation token is the
  model's argmax (exact match of the greedy continuation).

Prompts are llm-foundry's `InContextLearningDataset`: every string field stripped; few-shot
examples drawn from the same file, without the evaluated example, by one
`random.Random(fewshot_seed)` drawn from example after example (`get_fewshot_sample_idxs`), each
rendered `example_delimiter + context + continuation_delimiter + answer` after the
`prompt_string` (no delimiter before the first); the evaluated example's context ends with the
continuation delimiter, right-stripped, and for a GPT-2-style BPE the answer starts with a space.
The preamble (prompt string and few-shot examples) is tokenized with special tokens and without
a trailing EOS, the context and the answer without special tokens, and the three token lists
joined; a context too long for the model is cut from the left.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenmill.errors import TokenmillError
from tokenmill.eval.tasks.base import read_jsonl

if TYPE_CHECKING:
    from tokenmill.eval.models import TokenLM

TASK_TYPES = ("multiple_choice", "schema", "language_modeling")
# The fields each task type reads, and the one holding the choices `gold` indexes.
REQUIRED_FIELDS = {
    "multiple_choice": ("query", "choices", "gold"),
    "schema": ("context_options", "continuation", "gold"),
    "language_modeling": ("context", "continuation"),
}
CHOICES_FIELD = {"multiple_choice": "choices", "schema": "context_options"}
FEWSHOT_SEED = 1234  # llm-foundry's default `fewshot_random_seed`

Example = dict[str, Any]


@dataclass(frozen=True)
class IclTask:
    """One task of a suite: its file and llm-foundry's settings for it."""

    label: str
    file: str
    task_type: str
    num_fewshot: int = 0
    continuation_delimiter: str = " "
    example_delimiter: str = "\n"
    prompt_string: str = ""
    fewshot_seed: int = FEWSHOT_SEED
    # Percent accuracy of random guessing, for the centered accuracy (DCLM's eval_meta_data.csv).
    random_baseline: float = 0.0

    def __post_init__(self) -> None:
        if self.task_type not in TASK_TYPES:
            raise TokenmillError(
                f"task {self.label}: unknown icl_task_type {self.task_type!r}; one of: {', '.join(TASK_TYPES)}"
            )


@dataclass
class IclPrompt:
    """One evaluated example as the model reads it: a context per choice (one for language
    modeling) and the continuation scored after it, as text and as token ids."""

    contexts: list[str]
    continuations: list[str]
    context_tokens: list[list[int]]
    continuation_tokens: list[list[int]]
    gold: int | None


@dataclass
class IclTaskResult:
    """A task's accuracy, its centered accuracy and each example's outcome."""

    task: IclTask
    correct: list[bool]
    prompts: list[IclPrompt] = field(repr=False)
    # Each example's per-choice mean loglikelihood per token (multiple choice and schema).
    mean_loglikelihoods: list[list[float]] = field(repr=False, default_factory=list)

    @property
    def accuracy(self) -> float:
        return sum(self.correct) / len(self.correct)

    @property
    def centered_accuracy(self) -> float:
        return centered(self.accuracy, self.task.random_baseline)


def centered(accuracy: float, random_baseline: float) -> float:
    """DCLM's centered accuracy: 0 at random guessing, 1 at perfect (baseline in percent)."""
    chance = random_baseline / 100.0
    return (accuracy - chance) / (1.0 - chance)


def read_examples(path: Path, task: IclTask) -> list[Example]:
    """The examples of a task file, checked line by line (a bad one is named by file:line)."""
    required = REQUIRED_FIELDS[task.task_type]
    choices_field = CHOICES_FIELD.get(task.task_type)
    examples: list[Example] = []
    for where, example in read_jsonl(path):
        if not isinstance(example, dict):
            raise TokenmillError(f"{where}: not a JSON object")
        missing = [name for name in required if name not in example]
        if missing:
            raise TokenmillError(
                f"{where}: no field {', '.join(missing)} (a {task.task_type} example has {', '.join(required)})"
            )
        if choices_field is not None:
            choices = example[choices_field]
            if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
                raise TokenmillError(f"{where}: {choices_field} is not a list of strings")
            gold = example["gold"]
            if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(choices):
                raise TokenmillError(f"{where}: gold {gold!r} is not an index of its {len(choices)} {choices_field}")
        for name in required:
            if name != choices_field and name != "gold" and not isinstance(example[name], str):
                raise TokenmillError(f"{where}: {name} is not a string")
        examples.append(example)
    if not examples:
        raise TokenmillError(f"task {task.label}: {path} holds no examples")
    return examples


def fewshot_indices(dataset_size: int, num_fewshot: int, example_index: int, rng: random.Random) -> set[int]:
    """llm-foundry's `get_fewshot_sample_idxs`: a sample without the evaluated example; its set's
    iteration order is the examples' order in the prompt."""
    num_fewshot = min(dataset_size - 1, num_fewshot)
    indices = set(rng.sample(range(0, dataset_size), num_fewshot))
    if example_index in indices:
        indices.remove(example_index)
        if len(indices) >= dataset_size - 1:
            return indices
        replacement = rng.choice(range(0, dataset_size))
        while replacement in indices or replacement == example_index:
            replacement = rng.choice(range(0, dataset_size))
        indices.add(replacement)
    return indices


def _strip(example: Example) -> Example:
    return {key: value.strip() if isinstance(value, str) else value for key, value in example.items()}


def _solved(task: IclTask, example: Example, preceded: bool) -> str:
    """A few-shot example with its answer (construct_context with add_answer)."""
    if task.task_type == "multiple_choice":
        context, answer = example["query"], example["choices"][example["gold"]]
    elif task.task_type == "schema":
        context, answer = example["context_options"][example["gold"]], example["continuation"]
    else:
        context, answer = example["context"], example["continuation"]
    delimiter = task.example_delimiter if preceded else ""
    return f"{delimiter}{context}{task.continuation_delimiter}{answer}"


def build_prompts(model: TokenLM, task: IclTask, examples: Sequence[Example], count: int) -> list[IclPrompt]:
    """The prompts of the first `count` examples; few-shot examples come from all of them."""
    examples = [_strip(e) for e in examples]
    rng = random.Random(task.fewshot_seed)
    space = model.needs_prefix_space()
    raw: list[tuple[str, list[str], list[str], int | None]] = []
    for index in range(count):
        preamble = task.prompt_string
        if task.num_fewshot > 0:
            for shot in fewshot_indices(len(examples), task.num_fewshot, index, rng):
                preamble += _solved(task, examples[shot], preceded=len(preamble) > 0)
        example = examples[index]
        delimiter = task.example_delimiter if preamble else ""
        if task.task_type == "schema":
            tail = task.continuation_delimiter.rstrip() if preamble else ""
            contexts = [f"{delimiter}{option}{tail}" for option in example["context_options"]]
            answers = [example["continuation"]] * len(contexts)
        else:
            key = "query" if task.task_type == "multiple_choice" else "context"
            context = f"{delimiter}{example[key]}{task.continuation_delimiter}".rstrip()
            answers = list(example["choices"]) if task.task_type == "multiple_choice" else [example["continuation"]]
            contexts = [context] * len(answers)
        if space:
            answers = [a if a.startswith(" ") else f" {a}" for a in answers]
        raw.append((preamble, contexts, answers, example.get("gold") if task.task_type in CHOICES_FIELD else None))
    return _tokenize(model, task, raw)


def _tokenize(
    model: TokenLM, task: IclTask, raw: list[tuple[str, list[str], list[str], int | None]]
) -> list[IclPrompt]:
    # Strings repeat (choices, shared contexts): encode each distinct one once.
    preambles = sorted({preamble for preamble, _, _, _ in raw})
    pieces = sorted({text for _, contexts, answers, _ in raw for text in (*contexts, *answers)})
    preamble_ids = dict(zip(preambles, model.encode(preambles, add_special_tokens=True), strict=True))
    piece_ids = dict(zip(pieces, model.encode(pieces, add_special_tokens=False), strict=True))
    prompts = []
    for index, (preamble, contexts, answers, gold) in enumerate(raw):
        head = list(preamble_ids[preamble])
        if model.eos_token_id is not None and len(head) > 1 and head[-1] == model.eos_token_id:
            head = head[:-1]
        context_tokens, continuation_tokens = [], []
        for context, answer in zip(contexts, answers, strict=True):
            answer_ids = list(piece_ids[answer])
            room = model.max_length - len(answer_ids)
            if room < 0:
                raise TokenmillError(
                    f"task {task.label}, example {index}: the answer is {len(answer_ids)} tokens but the model reads "
                    f"at most {model.max_length} (its max_seq_len)"
                )
            ids = head + piece_ids[context]
            context_tokens.append(ids[len(ids) - room :] if len(ids) > room else ids)
            continuation_tokens.append(answer_ids)
        prompts.append(IclPrompt([preamble + c for c in contexts], answers, context_tokens, continuation_tokens, gold))
    return prompts


def score_task(
    model: TokenLM,
    task: IclTask,
    examples: Sequence[Example],
    limit: int | float | None = None,
    batch_size: int = 16,
    progress: bool = True,
) -> IclTaskResult:
    """Score the first `limit` examples of a task (below 1: that fraction; all without it) on a
    loaded model."""
    from tokenmill.eval.evaluator import apply_limit
    from tokenmill.eval.models import RequestError

    count = apply_limit(len(examples), limit)
    prompts = build_prompts(model, task, examples, count)
    flat = [pair for p in prompts for pair in zip(p.context_tokens, p.continuation_tokens, strict=True)]
    owners = [i for i, p in enumerate(prompts) for _ in p.continuations]
    try:
        scored = model.loglikelihood_tokens(flat, batch_size=batch_size, progress=progress, desc=task.label)
    except RequestError as error:
        raise TokenmillError(f"task {task.label}, example {owners[error.index]}: {error.reason}") from error
    correct: list[bool] = []
    means: list[list[float]] = []
    position = 0
    for prompt in prompts:
        got = scored[position : position + len(prompt.continuations)]
        position += len(prompt.continuations)
        if task.task_type == "language_modeling":
            correct.append(got[0][1])
            continue
        mean_ll = [ll / len(tokens) for (ll, _), tokens in zip(got, prompt.continuation_tokens, strict=True)]
        # InContextLearningMultipleChoiceAccuracy: the first choice of least perplexity, which
        # (exp being increasing) is the first of least mean cross-entropy.
        losses = [-m for m in mean_ll]
        correct.append(losses.index(min(losses)) == prompt.gold)
        means.append(mean_ll)
    return IclTaskResult(task, correct, prompts, means)
