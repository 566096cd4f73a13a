"""An independent reference of the llm-foundry ICL protocol and DCLM's CORE aggregation, written
from llm-foundry's published `InContextLearningDataset` / `get_fewshot_sample_idxs` /
`InContextLearningMultipleChoiceAccuracy` / `InContextLearningLMAccuracy` and DCLM's
`aggregated_metrics.py`: its own prompts, a `transformers` tokenizer called as llm-foundry calls
it, and one unbatched forward pass of the `transformers` model per input, with logits over every
position and torch's cross-entropy, as llm-foundry's metrics compute them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
import torch.nn.functional as F


def sample_indices(size: int, k: int, current: int, rng: random.Random) -> set[int]:
    k = min(size - 1, k)
    chosen = set(rng.sample(range(0, size), k))
    if current in chosen:
        chosen.remove(current)
        if len(chosen) >= size - 1:
            return chosen
        extra = rng.choice(range(0, size))
        while extra in chosen or extra == current:
            extra = rng.choice(range(0, size))
        chosen.add(extra)
    return chosen


def reference_task(model, tokenizer, task: dict, path: Path, limit: int, max_len: int) -> dict:
    """{"prompts": [(texts, continuations, context ids, continuation ids)], "correct": [...]}"""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [{k: (v.strip() if isinstance(v, str) else v) for k, v in r.items()} for r in rows]
    kind = task["icl_task_type"]
    cd = task.get("continuation_delimiter", " ")
    ed = task.get("example_delimiter", "\n")
    k = task.get("num_fewshot", 0)
    rng = random.Random(task.get("fewshot_random_seed", 1234))
    prefix_space = len(tokenizer(" a", add_special_tokens=False)["input_ids"]) == 1
    out = {"prompts": [], "correct": []}
    for i in range(min(limit, len(rows))):
        text = task.get("prompt_string", "")
        if k > 0:
            for j in sample_indices(len(rows), k, i, rng):
                shot = rows[j]
                if kind == "multiple_choice":
                    body = shot["query"] + cd + shot["choices"][shot["gold"]]
                elif kind == "schema":
                    body = shot["context_options"][shot["gold"]] + cd + shot["continuation"]
                else:
                    body = shot["context"] + cd + shot["continuation"]
                text += (ed if text else "") + body
        row = rows[i]
        if kind == "schema":
            if text:
                contexts = [ed + c + cd.rstrip() for c in row["context_options"]]
            else:
                contexts = list(row["context_options"])
            conts = [row["continuation"]] * len(contexts)
        else:
            ctx = ((ed if text else "") + (row["query"] if kind == "multiple_choice" else row["context"]) + cd).rstrip()
            conts = list(row["choices"]) if kind == "multiple_choice" else [row["continuation"]]
            contexts = [ctx] * len(conts)
        if prefix_space:
            conts = [c if c.startswith(" ") else " " + c for c in conts]
        pre = tokenizer(text)["input_ids"]
        if tokenizer.eos_token_id is not None and len(pre) > 1 and pre[-1] == tokenizer.eos_token_id:
            pre = pre[:-1]
        ctx_ids, cont_ids, losses, greedy = [], [], [], []
        for c, a in zip(contexts, conts):
            cids = pre + tokenizer(c, add_special_tokens=False)["input_ids"]
            aids = tokenizer(a, add_special_tokens=False)["input_ids"]
            if len(cids) + len(aids) > max_len:
                cids = cids[-(max_len - len(aids)) :]
            ctx_ids.append(cids)
            cont_ids.append(aids)
            inp = torch.tensor([cids + aids])
            with torch.no_grad():
                logits = model(inp).logits[0]
            span = torch.arange(len(cids), len(cids) + len(aids))
            picked = logits.index_select(0, span - 1)
            target = torch.tensor(aids)
            losses.append(float(torch.exp(F.cross_entropy(picked, target))))
            greedy.append(bool((picked.argmax(-1) == target).all()))
        out["prompts"].append(([text + c for c in contexts], conts, ctx_ids, cont_ids))
        if kind == "language_modeling":
            out["correct"].append(greedy[0])
        else:
            out["correct"].append(losses.index(min(losses)) == row["gold"])
    return out


def centered_mean(accuracies: dict[str, float], baselines: dict[str, float]) -> float:
    """DCLM's low_variance_datasets_centered: mean of (acc - 0.01 b) / (1 - 0.01 b)."""
    values = [(accuracies[t] - 0.01 * baselines[t]) / (1.0 - 0.01 * baselines[t]) for t in accuracies]
    return sum(values) / len(values)
