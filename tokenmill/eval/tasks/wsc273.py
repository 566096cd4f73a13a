"""WSC273 (Levesque et al., 2012): the Winograd Schema Challenge's 273 pronoun resolutions.

Harness: `lm_eval/tasks/wsc273/` (default.yaml + utils.py), scored partially as WinoGrande is:
each option replaces the pronoun to make a context, and the model scores the rest of the
sentence after each. Its dataset, `lighteval/winograd_wsc` `wsc273`, has `text`, `pronoun`,
`pronoun_loc` (character offset of the pronoun), `quote`, `quote_loc`, `options` (two) and
`label` (0/1); it has only a test split, which also gives the few-shot examples.
"""

from __future__ import annotations

from tokenmill.eval.tasks.base import Doc, RowError, Task, exported_files, parse_label, require_fields

# Options starting with these words are lowered unless the pronoun starts a sentence.
UPPER_PRONOUNS = ("A", "An", "The", "She", "He", "It", "They", "My", "His", "Her", "Their")
POSSESSIVE_PRONOUNS = ("my", "his", "her", "our", "their")


def normalize_option(doc: Doc, option: str) -> str:
    """The harness's `__normalize_option`: an option as it reads in place of the pronoun."""
    if doc["pronoun"].lower() in POSSESSIVE_PRONOUNS:
        option += "'s"
    pronoun = option.split()[0]
    start_of_sentence = doc["text"][doc["pronoun_loc"] - 2] == "."
    if not start_of_sentence and pronoun in UPPER_PRONOUNS:
        return option.replace(pronoun, pronoun.lower())
    return option


class Wsc273(Task):
    name = "wsc273"
    metrics = ("acc",)
    multiple_input = True
    harness_splits = {"train": None, "validation": None, "test": "test"}
    local_files = exported_files("wsc273", ("test",))
    hf_dataset = ("lighteval/winograd_wsc", "wsc273")
    source = "https://huggingface.co/datasets/lighteval/winograd_wsc (wsc273, as JSON lines)"

    def process_doc(self, doc: Doc) -> Doc:
        require_fields(doc, "text", "pronoun", "pronoun_loc", "options", "label")
        if len(doc["options"]) != 2:
            raise RowError(f"options has {len(doc['options'])} entries, not 2")
        # As the harness: double spaces collapse (pronoun_loc is kept as stored).
        doc = {**doc, "text": doc["text"].replace("  ", " "), "label": parse_label(doc["label"], 2)}
        doc["options"] = [normalize_option(doc, option) for option in doc["options"]]
        return doc

    def doc_to_text(self, doc: Doc) -> int:
        # The index of the correct context (the harness's doc_to_text is the `label` field).
        return doc["label"]

    def doc_to_target(self, doc: Doc) -> str:
        return doc["text"][doc["pronoun_loc"] + len(doc["pronoun"]) :]

    def doc_to_choice(self, doc: Doc) -> list[str]:
        template = doc["text"][: doc["pronoun_loc"]]
        return [template + option for option in doc["options"]]
