"""tokenmill: from raw text corpora to an evaluated language model."""

__version__ = "0.1.0"
