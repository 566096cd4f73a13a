"""Normalize: repair mojibake (ftfy), Unicode NFC, and whitespace clean-up.

Each step can be turned off. Documents that are empty after normalization are rejected with
`empty_after_normalize`; `stats` counts how many documents each step changed.
"""

from __future__ import annotations

import argparse
import re
import unicodedata
from dataclasses import dataclass

import pandas as pd

from tokenmill.curate.stage import DocumentStage, StageOutput, reject

_TRAILING_SPACE = re.compile(r"[ \t\u00a0]+$", re.MULTILINE)
_BLANK_RUNS = re.compile(r"\n{3,}")
_INNER_SPACES = re.compile(r"(?<=\S)[ \t]{2,}(?=\S)")


def clean_whitespace(text: str) -> str:
    """Unify line endings, drop trailing spaces, squeeze runs of spaces between words and of
    blank lines (paragraph breaks survive as one blank line), strip the ends."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _TRAILING_SPACE.sub("", text)
    text = _INNER_SPACES.sub(" ", text)
    text = _BLANK_RUNS.sub("\n\n", text)
    return text.strip()


@dataclass
class NormalizeStage(DocumentStage):
    fix_unicode: bool = True
    nfc: bool = True
    whitespace: bool = True

    name = "normalize"

    def versions(self) -> dict[str, str]:
        import ftfy

        return {"ftfy": ftfy.__version__, "unicodedata": unicodedata.unidata_version}

    def normalize(self, text: str) -> tuple[str, list[str]]:
        """The normalized text and the names of the steps that changed it."""
        changed = []
        if self.fix_unicode:
            import ftfy

            fixed = ftfy.fix_text(text, normalization="NFC" if self.nfc else None)
            if fixed != text:
                changed.append("fix_unicode")
            text = fixed
        if self.nfc:
            composed = unicodedata.normalize("NFC", text)
            if composed != text:
                changed.append("nfc")
            text = composed
        if self.whitespace:
            cleaned = clean_whitespace(text)
            if cleaned != text:
                changed.append("whitespace")
            text = cleaned
        return text, changed

    def process(self, docs: pd.DataFrame) -> StageOutput:
        stats: dict[str, int] = {}
        texts = []
        for text in docs["text"].tolist():
            normalized, changed = self.normalize(text)
            texts.append(normalized)
            for step in changed:
                stats[f"changed.{step}"] = stats.get(f"changed.{step}", 0) + 1
        docs = docs.assign(text=texts)
        empty = docs["text"].str.strip().str.len() == 0
        return StageOutput(
            n_in=len(docs), kept=docs[~empty], rejected=reject(docs[empty], "empty_after_normalize"), stats=stats
        )


def add_command(stages: argparse._SubParsersAction) -> None:
    from tokenmill.curate.cli import add_stage_arguments, print_summary, runner_options, stage_input
    from tokenmill.curate.stage import run_stage

    parser = stages.add_parser("normalize", help="fix Unicode (ftfy), NFC, clean whitespace")
    add_stage_arguments(parser)
    parser.add_argument("--no-fix-unicode", action="store_true", help="skip ftfy.fix_text")
    parser.add_argument("--no-nfc", action="store_true", help="skip Unicode NFC normalization")
    parser.add_argument("--no-whitespace", action="store_true", help="skip whitespace clean-up")

    def run(args: argparse.Namespace) -> int:
        stage = NormalizeStage(fix_unicode=not args.no_fix_unicode, nfc=not args.no_nfc, whitespace=not args.no_whitespace)
        manifest = run_stage(stage, stage_input(args), args.output, **runner_options(args))
        print_summary(manifest, args.output)
        return 0

    parser.set_defaults(func=run)
