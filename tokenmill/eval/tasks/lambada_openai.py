"""LAMBADA, OpenAI's detokenized version (Paperno et al., 2016; Radford et al., 2019).

Harness: `lm_eval/tasks/lambada/lambada_openai.yaml`: predict the last word of a passage;
perplexity of that word and accuracy (is it the greedy continuation). Original file
(openai/gpt-2 output, mirrored by cybertronai/bflm): `lambada_test.jsonl` with `text`.
"""

from __future__ import annotations

from tokenmill.eval.tasks.base import Doc, SplitFiles, Task


class LambadaOpenAI(Task):
    name = "lambada_openai"
    output_type = "loglikelihood"
    metrics = ("perplexity", "acc")
    harness_splits = {"train": None, "validation": None, "test": "test"}
    local_files = {
        "test": SplitFiles(("lambada_openai_test.jsonl", "lambada_test.jsonl", "lambada_openai/test.jsonl")),
    }
    hf_dataset = ("EleutherAI/lambada_openai", "default")
    source = "https://github.com/cybertronai/bflm (lambada_test.jsonl)"

    def doc_to_text(self, doc: Doc) -> str:
        # Split on single spaces exactly as the harness's Jinja template does.
        return " ".join(doc["text"].split(" ")[:-1])

    def doc_to_target(self, doc: Doc) -> str:
        return " " + doc["text"].split(" ")[-1]
