"""WinoGrande (Sakaguchi et al., 2020): fill the blank with one of two names, scored partially.

Harness: `lm_eval/tasks/winogrande/` (partial scoring as Trinh & Le, 2018): the two contexts are
the sentence up to `_` with each option substituted; the shared continuation is the text after
`_`; the model scores the continuation under each context. Original files
(allenai/winogrande, `dev.jsonl`, `train_{xs,s,m,l,xl}.jsonl`) have `sentence`, `option1`,
`option2` and `answer` "1"/"2".
"""

from __future__ import annotations

from tokenmill.eval.tasks.base import Doc, RowError, SplitFiles, Task, parse_label, require_fields

# The harness draws few-shot examples from train_xl; locally the largest size present is used.
_TRAIN_SIZES = ("xl", "l", "m", "s", "xs")


class WinoGrande(Task):
    name = "winogrande"
    metrics = ("acc",)
    multiple_input = True
    harness_splits = {"train": "train", "validation": "validation", "test": None}
    local_files = {
        "train": SplitFiles(
            tuple(f"winogrande_train_{s}.jsonl" for s in _TRAIN_SIZES)
            + tuple(f"winogrande/train_{s}.jsonl" for s in _TRAIN_SIZES)
        ),
        "validation": SplitFiles(("winogrande_dev.jsonl", "winogrande/dev.jsonl")),
    }
    hf_dataset = ("allenai/winogrande", "winogrande_xl")
    source = "https://github.com/allenai/winogrande (winogrande_1.1.zip: dev.jsonl, train_xl.jsonl)"

    def process_doc(self, doc: Doc) -> Doc:
        require_fields(doc, "sentence", "option1", "option2")
        if "_" not in doc["sentence"]:
            raise RowError("the sentence has no blank '_' for the options to fill")
        # `answer` names option 1 or 2 ("1"/"2", as the harness's dataset stores it).
        return {**doc, "answer": str(parse_label(doc["answer"], 2, ("1", "2"), indexes=False) + 1)}

    def doc_to_text(self, doc: Doc) -> int:
        # The index of the correct context (the harness's doc_to_text returns the gold index).
        return {"1": 0, "2": 1}[doc["answer"]]

    def doc_to_target(self, doc: Doc) -> str:
        idx = doc["sentence"].index("_") + 1
        return doc["sentence"][idx:].strip()

    def doc_to_choice(self, doc: Doc) -> list[str]:
        idx = doc["sentence"].index("_")
        return [doc["sentence"][:idx] + opt for opt in (doc["option1"], doc["option2"])]
