"""Model adapters: loglikelihood of continuations, computed as lm-evaluation-harness's HFLM does.

Scoring follows `TemplateLM.loglikelihood` / `HFLM._loglikelihood_tokens` (0.4.x):

- trailing whitespace of the context moves to the continuation; the continuation's tokens are
  `enc(ctx + cont)[len(enc(ctx)):]`; an empty context is replaced by the BOS (else EOS) token;
- the model reads `(ctx_enc + cont_enc)[-(max_length + 1):][:-1]` (left truncation), right-padded
  in batches of requests sorted by length (longest first);
- the score is the sum of log-softmax over the continuation tokens, and `is_greedy` says whether
  every continuation token is the argmax.

Where this is faster than the harness, the numbers stay the same: the output projection and the
log-softmax run only at the continuation positions (not over every position of every padded
row), requests whose model input is identical run once, and strings repeated across choices are
tokenized once, in batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from tokenmill.errors import TokenmillError
from tokenmill.progress import progress_bar
from tokenmill.train.checkpoint import load_for_inference

DEFAULT_MAX_LENGTH = 2048  # the harness's default when neither config nor tokenizer says
TOKENIZER_INFINITY = 1000000000000000019884624838656  # transformers' "no limit" model_max_length


class RequestError(TokenmillError):
    """A request the model cannot score; `index` is its position in the list scored."""

    def __init__(self, index: int, reason: str, needed: int | None = None) -> None:
        super().__init__(f"request {index}: {reason}")
        self.index = index
        self.reason = reason
        # The max_seq_len the request needs, when length is the problem.
        self.needed = needed


@dataclass
class _Item:
    """One unique model input and the requests it answers."""

    inp: list[int]
    # (request index, continuation tokens) for every request sharing this exact input.
    users: list[tuple[int, list[int]]]


class TokenLM:
    """Shared loglikelihood machinery; subclasses provide tokenization and the forward pass."""

    name: str = "model"
    max_length: int = DEFAULT_MAX_LENGTH
    prefix_token_id: int = 0
    # The end-of-sequence token (llm-foundry drops it from the end of an encoded few-shot preamble).
    eos_token_id: int | None = None
    # The decoded prefix token: strings starting with it are encoded without special tokens.
    prefix_text: str | None = None
    device: torch.device = torch.device("cpu")
    # Requests whose inputs share at least this many leading tokens (a k-shot context read by
    # every choice) run that prefix once and reuse its key/value cache; 0 turns it off.
    min_shared_prefix: int = 48

    # ----- to implement -----
    def _encode_raw(self, texts: list[str], add_special_tokens: bool | None) -> list[list[int]]:
        raise NotImplementedError

    def _forward_selected(self, inputs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """inputs [B, T] -> logits [N, V] at the positions where keep [B, T] is True (row-major)."""
        raise NotImplementedError

    def _forward_with_prefix(
        self, prefix: torch.Tensor, suffixes: torch.Tensor, keep: torch.Tensor
    ) -> torch.Tensor | None:
        """Run `prefix` [P] once, then `suffixes` [B, S] after it; logits where keep [B, S].

        None when the model has no key/value cache to reuse (the caller falls back).
        """
        return None

    # ----- tokenization as the harness's tok_encode -----
    def encode(self, texts: Sequence[str], add_special_tokens: bool | None = None) -> list[list[int]]:
        if add_special_tokens is not None or not self.prefix_text:
            return self._encode_raw(list(texts), add_special_tokens)
        # A string that already starts with the BOS text must not get a second BOS.
        out: list[list[int]] = [[] for _ in texts]
        plain = [i for i, t in enumerate(texts) if not t.startswith(self.prefix_text)]
        prefixed = [i for i, t in enumerate(texts) if t.startswith(self.prefix_text)]
        for idx, special in ((plain, None), (prefixed, False)):
            if idx:
                for i, ids in zip(idx, self._encode_raw([texts[i] for i in idx], special), strict=True):
                    out[i] = ids
        return out

    def encode_requests(self, requests: Sequence[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
        """(context, continuation) strings -> (context tokens, continuation tokens)."""
        split: list[tuple[str, str]] = []
        for context, continuation in requests:
            if context:
                n_spaces = len(context) - len(context.rstrip())
                if n_spaces > 0:
                    continuation = context[-n_spaces:] + continuation
                    context = context[:-n_spaces]
            split.append((context, continuation))
        # Contexts repeat across choices: encode each distinct string once, in one batch call.
        wanted = sorted({c for c, _ in split if c} | {c + k for c, k in split if c})
        ids = dict(zip(wanted, self.encode(wanted), strict=True))
        empties = sorted({k for c, k in split if not c})
        empty_ids = dict(zip(empties, self.encode(empties, add_special_tokens=False), strict=True)) if empties else {}
        out: list[tuple[list[int], list[int]]] = []
        for context, continuation in split:
            if not context:
                cont = empty_ids[continuation]
                if cont and cont[0] == self.prefix_token_id:
                    out.append((cont[:1], cont[1:]))
                else:
                    out.append(([self.prefix_token_id], cont))
            else:
                ctx = ids[context]
                out.append((ctx, ids[context + continuation][len(ctx) :]))
        return out

    def needs_prefix_space(self) -> bool:
        """llm-foundry's test for a GPT-2-style BPE, where an answer starts with its own space:
        " a" is one token."""
        return len(self.encode([" a"], add_special_tokens=False)[0]) == 1

    # ----- scoring -----
    def loglikelihood_rolling(
        self, texts: Sequence[str], batch_size: int = 16, progress: bool = True, desc: str = "loglikelihood_rolling"
    ) -> list[float]:
        """log P(text) of whole documents, as the harness's `loglikelihood_rolling` scores them:
        the text's tokens (no special tokens) after the prefix (EOD/BOS) token, in disjoint windows
        of the model's length, each window reading the tokens before it."""
        windows: list[tuple[list[int], list[int]]] = []
        owners: list[int] = []
        for index, tokens in enumerate(self.encode(texts, add_special_tokens=False)):
            for window in rolling_windows(tokens, self.prefix_token_id, self.max_length):
                windows.append(window)
                owners.append(index)
        totals = [0.0] * len(texts)
        scored = self.loglikelihood_tokens(windows, batch_size=batch_size, progress=progress, desc=desc)
        for index, (ll, _) in zip(owners, scored, strict=True):
            totals[index] += ll
        return totals

    def loglikelihood(
        self,
        requests: Sequence[tuple[str, str]],
        batch_size: int = 16,
        progress: bool = True,
        desc: str = "loglikelihood",
    ) -> list[tuple[float, bool]]:
        """(log P(continuation | context), is_greedy) for each (context, continuation)."""
        encoded = self.encode_requests(requests)
        return self.loglikelihood_tokens(encoded, batch_size=batch_size, progress=progress, desc=desc)

    def loglikelihood_tokens(
        self,
        encoded: Sequence[tuple[list[int], list[int]]],
        batch_size: int = 16,
        progress: bool = True,
        desc: str = "loglikelihood",
    ) -> list[tuple[float, bool]]:
        items: dict[tuple[int, ...], _Item] = {}
        for i, (ctx, cont) in enumerate(encoded):
            if not ctx or not cont:
                raise RequestError(i, "the context or the continuation is empty after tokenization")
            if len(cont) > self.max_length:
                # The context is cut from the left (below) as the harness cuts it; a continuation
                # longer than the model cannot be scored (the harness fails an assertion here).
                raise RequestError(
                    i,
                    f"the continuation is {len(cont)} tokens but the model reads at most {self.max_length} "
                    "(its max_seq_len)",
                    needed=len(cont),
                )
            inp = (ctx + cont)[-(self.max_length + 1) :][:-1]
            item = items.setdefault(tuple(inp), _Item(inp, []))
            item.users.append((i, cont))
        results: list[tuple[float, bool] | None] = [None] * len(encoded)
        bar = progress_bar(total=len(encoded), desc=desc, unit="req", enabled=progress)
        rest = list(items.values())
        if self.min_shared_prefix > 0:
            families, rest = self._families(rest)
            for prefix_len, family in families:
                if not self._score_family(prefix_len, family, results):
                    rest.extend(family)
                    continue
                bar.update(sum(len(it.users) for it in family))
        # Longest first, as the harness orders them: padding stays small and any OOM comes early.
        order = sorted(rest, key=lambda it: (-len(it.inp), tuple(it.inp)))
        for start in range(0, len(order), max(1, batch_size)):
            chunk = order[start : start + batch_size]
            self._score_chunk(chunk, results)
            bar.update(sum(len(it.users) for it in chunk))
        bar.close()
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def _families(self, items: list[_Item]) -> tuple[list[tuple[int, list[_Item]]], list[_Item]]:
        """Group inputs that share a long common prefix (neighbours in token order).

        A family's prefix stops before the first scored position of any member, so every scored
        logit comes from the suffix pass.
        """

        def first_scored(it: _Item) -> int:
            return len(it.inp) - min(max(len(c) for _, c in it.users), len(it.inp))

        def common(a: list[int], b: list[int], limit: int) -> int:
            n = 0
            while n < limit and a[n] == b[n]:
                n += 1
            return n

        ordered = sorted(items, key=lambda it: tuple(it.inp))
        families: list[tuple[int, list[_Item]]] = []
        singles: list[_Item] = []
        i = 0
        while i < len(ordered):
            head = ordered[i]
            prefix = first_scored(head)
            members = [head]
            j = i + 1
            while j < len(ordered):
                shared = common(head.inp, ordered[j].inp, min(prefix, first_scored(ordered[j])))
                if shared < self.min_shared_prefix:
                    break
                prefix = shared
                members.append(ordered[j])
                j += 1
            if len(members) > 1:
                families.append((prefix, members))
            else:
                singles.append(head)
            i = j
        return families, singles

    @torch.no_grad()
    def _score_family(self, prefix_len: int, family: list[_Item], results: list[tuple[float, bool] | None]) -> bool:
        width = max(len(it.inp) for it in family) - prefix_len
        suffixes = torch.zeros((len(family), width), dtype=torch.long)
        keep = torch.zeros((len(family), width), dtype=torch.bool)
        spans: list[tuple[int, int]] = []
        offset = 0
        for row, item in enumerate(family):
            tail = item.inp[prefix_len:]
            suffixes[row, : len(tail)] = torch.tensor(tail, dtype=torch.long)
            span = min(max(len(c) for _, c in item.users), len(item.inp))
            keep[row, len(tail) - span : len(tail)] = True
            spans.append((offset, span))
            offset += span
        prefix = torch.tensor(family[0].inp[:prefix_len], dtype=torch.long)
        logits = self._forward_with_prefix(prefix.to(self.device), suffixes.to(self.device), keep.to(self.device))
        if logits is None:
            return False
        self._collect(family, spans, logits, results)
        return True

    @torch.no_grad()
    def _score_chunk(self, chunk: list[_Item], results: list[tuple[float, bool] | None]) -> None:
        width = len(chunk[0].inp)
        inputs = torch.zeros((len(chunk), width), dtype=torch.long)  # right padding with 0s
        keep = torch.zeros((len(chunk), width), dtype=torch.bool)
        spans: list[tuple[int, int]] = []  # (offset into selected rows, number of positions)
        offset = 0
        for row, item in enumerate(chunk):
            n = len(item.inp)
            inputs[row, :n] = torch.tensor(item.inp, dtype=torch.long)
            # The longest continuation among the requests that share this input decides the span.
            span = min(max(len(c) for _, c in item.users), n)
            keep[row, n - span : n] = True
            spans.append((offset, span))
            offset += span
        logits = self._forward_selected(inputs.to(self.device), keep.to(self.device))
        self._collect(chunk, spans, logits, results)

    @staticmethod
    def _collect(
        chunk: list[_Item], spans: list[tuple[int, int]], logits: torch.Tensor, results: list[tuple[float, bool] | None]
    ) -> None:
        logprobs = F.log_softmax(logits.float(), dim=-1)
        greedy = logprobs.argmax(dim=-1)
        for item, (start, span) in zip(chunk, spans, strict=True):
            for index, cont in item.users:
                # A continuation is the tail of its input window (len(cont) <= span, as the
                # harness asserts), so its scores are the last len(cont) kept positions.
                rows = slice(start + span - len(cont), start + span)
                target = torch.tensor(cont, dtype=torch.long, device=logprobs.device)
                lp = logprobs[rows].gather(1, target[:, None]).sum()
                results[index] = (float(lp), bool((greedy[rows] == target).all()))


def rolling_windows(tokens: list[int], prefix_token: int, max_length: int) -> list[tuple[list[int], list[int]]]:
    """(context, continuation) windows covering every token once: the harness's
    `get_rolling_token_windows(context_len=1)` followed by `make_disjoint_window`."""
    if not tokens:
        return []
    first = min(max_length, len(tokens))
    windows = [([prefix_token], tokens[:first])]
    predicted = first
    while predicted < len(tokens):
        end = predicted + min(len(tokens) - predicted, max_length)
        # Each later window reads the max_length tokens before its last one; its context is the
        # part of that read before the predicted tokens.
        window_input = tokens[max(0, end - max_length - 1) : end - 1]
        predicted_tokens = tokens[predicted:end]
        windows.append((window_input[: len(window_input) - (len(predicted_tokens) - 1)], predicted_tokens))
        predicted = end
    return windows


def resolve_max_length(config: object, tokenizer: object | None) -> int:
    """The harness's rule: config n_positions / max_position_embeddings / n_ctx, then tokenizer."""
    cfg = getattr(config, "text_config", None) or config
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(cfg, attr, None)
        if value is not None:
            return int(value)
    limit = getattr(tokenizer, "model_max_length", None)
    if limit is not None and limit != TOKENIZER_INFINITY:
        return int(limit)
    return DEFAULT_MAX_LENGTH


class HFModel(TokenLM):
    """A `transformers` causal LM directory with its tokenizer (loaded locally)."""

    def __init__(
        self, path: str | Path, device: str = "cpu", dtype: str = "float32", max_length: int | None = None
    ) -> None:
        try:
            import transformers
        except ImportError as error:  # pragma: no cover
            raise TokenmillError("evaluating a transformers model needs `pip install transformers`") from error
        path = Path(path)
        torch_dtype = getattr(torch, dtype)
        try:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as error:
            raise TokenmillError(f"{path}: cannot load its tokenizer ({type(error).__name__}: {error})") from error
        # transformers draws a weight-loading bar on stderr even off a terminal: keep errors one line.
        bars = transformers.utils.logging.is_progress_bar_enabled()
        transformers.utils.logging.disable_progress_bar()
        try:
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                str(path), dtype=torch_dtype, local_files_only=True
            )
        except TypeError:  # transformers < 4.56 names it torch_dtype
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                str(path), torch_dtype=torch_dtype, local_files_only=True
            )
        finally:
            if bars:
                transformers.utils.logging.enable_progress_bar()
        self.model.eval().to(device)
        self.device = torch.device(device)
        self.name = str(path)
        self.max_length = max_length or resolve_max_length(self.model.config, self.tokenizer)
        tok = self.tokenizer
        prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        if prefix is None:
            raise TokenmillError(f"{path}: the tokenizer has neither a BOS nor an EOS token")
        self.prefix_token_id = int(prefix)
        self.eos_token_id = tok.eos_token_id
        self.prefix_text = tok.decode(self.prefix_token_id)
        self._keep_mode = self._detect_keep_mode()
        self._cache_arg = self._detect_cache_arg()

    def _detect_keep_mode(self) -> str:
        """How to ask the model for logits at chosen positions only.

        "mask": transformers >= 5 models that slice with `slice_logits_to_keep` take a [B, T]
        boolean mask; "range": older ones take a 1-D tensor of positions (the span covering
        every row's continuation); "all": compute every position's logits and select after.
        """
        import inspect

        forward = type(self.model).forward
        if "logits_to_keep" not in inspect.signature(forward).parameters:
            return "all"
        try:
            source = inspect.getsource(forward)
        except (OSError, TypeError):
            source = ""
        return "mask" if "slice_logits_to_keep" in source else "range"

    def _encode_raw(self, texts: list[str], add_special_tokens: bool | None) -> list[list[int]]:
        if not texts:
            return []
        kwargs = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        return [list(ids) for ids in self.tokenizer(texts, **kwargs)["input_ids"]]

    def _forward_selected(self, inputs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        if self._keep_mode == "mask":
            logits = self.model(inputs, logits_to_keep=keep).logits
            logits = logits.reshape(-1, logits.shape[-1])
            if logits.shape[0] != int(keep.sum()):  # a model that ignores the mask: select here
                logits = self.model(inputs).logits[keep]
            return logits
        if self._keep_mode == "range":
            cols = keep.any(dim=0).nonzero().flatten()
            lo, hi = int(cols.min()), int(cols.max()) + 1
            logits = self.model(inputs, logits_to_keep=torch.arange(lo, hi, device=inputs.device)).logits
            return logits[keep[:, lo:hi]]
        return self.model(inputs).logits[keep]

    def _forward_with_prefix(
        self, prefix: torch.Tensor, suffixes: torch.Tensor, keep: torch.Tensor
    ) -> torch.Tensor | None:
        if not getattr(self.model.config, "use_cache", True) or self._keep_mode == "all" or self._cache_arg is None:
            return None
        out = self.model(prefix[None, :], use_cache=True, logits_to_keep=1)
        # The key/value cache under the name this transformers uses for it, in and out: `cache`
        # since 5.24 (where `past_key_values` warns, and goes away in 5.40), before that
        # `past_key_values`. A `Cache` object (DynamicCache) can be repeated per suffix; an older
        # model's tuple of tensors cannot, and is scored without reuse.
        cache = getattr(out, self._cache_arg, None)
        if cache is None or not hasattr(cache, "batch_repeat_interleave"):
            return None
        cache.batch_repeat_interleave(suffixes.shape[0])
        given = {self._cache_arg: cache}
        if self._keep_mode == "mask":
            logits = self.model(suffixes, use_cache=True, logits_to_keep=keep, **given).logits
            logits = logits.reshape(-1, logits.shape[-1])
            return logits if logits.shape[0] == int(keep.sum()) else None
        logits = self.model(suffixes, use_cache=True, **given).logits
        return logits[keep]

    def _detect_cache_arg(self) -> str | None:
        """The name of the key/value cache in the model's forward and output: `cache` since
        transformers 5.24, `past_key_values` before; None for a model that takes neither
        (scored without prefix reuse)."""
        import inspect

        parameters = inspect.signature(type(self.model).forward).parameters
        return next((name for name in ("cache", "past_key_values") if name in parameters), None)


class RunTokenLM(TokenLM):
    """Tokenization of a tokenmill run: the tokenizer file its meta names, with the EOD token
    as the prefix (BOS) and EOS token, as `export-hf` writes them; subclasses give the forward."""

    def _use_tokenizer(self, tokenizer_path: str | None, meta: dict) -> None:
        from tokenizers import Tokenizer

        if not tokenizer_path or not Path(tokenizer_path).exists():
            raise TokenmillError(f"{self.name}: checkpoint meta names no readable tokenizer ({tokenizer_path!r})")
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self.prefix_token_id = self._prefix_id(meta)
        self.eos_token_id = self.prefix_token_id  # the EOD, exported as EOS
        # As tok_encode does for transformers tokenizers: text that already starts with the
        # prefix token is encoded without special tokens.
        self.prefix_text = self.tokenizer.decode([self.prefix_token_id], skip_special_tokens=False) or None

    def _prefix_id(self, meta: dict) -> int:
        """The EOD token, which `export-hf` writes as both BOS and EOS (as GPT-2 does)."""
        for key in ("eod_id", "eos_id", "bos_id"):
            if isinstance(meta.get(key), int):
                return int(meta[key])
        from tokenmill.tokenize.special import find_eod_id

        tid = find_eod_id(self.tokenizer)  # a checkpoint that predates `eod_id` in its meta
        if tid is not None:
            return tid
        raise TokenmillError(f"{self.name}: the tokenizer has no end-of-document token to use as prefix")

    def _encode_raw(self, texts: list[str], add_special_tokens: bool | None) -> list[list[int]]:
        special = True if add_special_tokens is None else add_special_tokens
        return [enc.ids for enc in self.tokenizer.encode_batch(texts, add_special_tokens=special)]


class NativeModel(RunTokenLM):
    """A tokenmill checkpoint or run directory, through `tokenmill.train.checkpoint`."""

    def __init__(self, path: str | Path, device: str = "cpu", max_length: int | None = None) -> None:
        model, config, meta = load_for_inference(str(path), device=device)
        self.model = model.eval()
        self.config = config
        self.device = torch.device(device)
        self.name = str(path)
        self.max_length = max_length or int(config.max_seq_len)
        self._use_tokenizer(meta.get("tokenizer"), meta)

    def _forward_selected(self, inputs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        # GPT.forward returns hidden states when `output` is None (the pipeline-stage contract):
        # project only the kept positions.
        output = self.model.output
        self.model.output = None
        try:
            hidden = self.model(inputs)
        finally:
            self.model.output = output
        return output(hidden[keep])


def is_hf_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and any(
        (path / name).exists() for name in ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")
    )


def load_model(path: str | Path, device: str = "cpu", max_length: int | None = None) -> TokenLM:
    """A transformers directory (config.json + weights) or a tokenmill run/checkpoint directory."""
    p = Path(path)
    if not p.exists():
        raise TokenmillError(f"model path {p} does not exist")
    if is_hf_dir(p):
        return HFModel(p, device=device, max_length=max_length)
    if (p / "meta.json").exists() or (p / "checkpoints").is_dir() or (p / "latest").exists():
        return NativeModel(p, device=device, max_length=max_length)
    raise TokenmillError(
        f"{p} is neither a transformers model directory (config.json + model.safetensors) "
        "nor a tokenmill run or checkpoint directory (meta.json, checkpoints/)"
    )
