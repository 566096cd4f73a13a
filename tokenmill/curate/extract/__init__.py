"""HTML pages -> main text: the `extract` curate stage (`stage.py`) and its extractors
(`html_text.py`: the extractors and their child process; `lean_html.py`, `lean_stages.py`,
`lean_readability.py`: trafilatura's passes on a stripped tree)."""
