"""Cross-entropy of the output head computed a chunk of tokens at a time, so that the logits
[tokens, vocab] never exist whole (parallel.loss_chunk_tokens).

At a 128k vocabulary the fp32 logits of 8192 tokens are 4 GiB, and the plain path keeps them
and their softmax for the backward pass. Here the forward pass keeps, per token, only the
log-sum-exp; the backward pass computes each chunk's logits again and turns them into the
chunk's gradients (softmax - one-hot) for the hidden states and the head's weight at once.
Peak memory is one chunk's logits, for one more head matmul's worth of compute.
"""

from __future__ import annotations

from typing import Any

import torch


class ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of `hidden @ weight.T` against `labels`, chunk by chunk."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_tokens: int
    ) -> torch.Tensor:
        n = hidden.shape[0]
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        logsumexp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        compute_dtype = hidden.dtype
        for start in range(0, n, chunk_tokens):
            end = min(start + chunk_tokens, n)
            # Under autocast the matmul runs in the autocast dtype, as the plain head's does.
            logits = hidden[start:end] @ weight.t()
            compute_dtype = logits.dtype
            logits = logits.float()  # fp32 softmax, as the plain path's cross_entropy
            logsumexp[start:end] = torch.logsumexp(logits, dim=-1)
            target = logits.gather(1, labels[start:end, None]).squeeze(1)
            total += (logsumexp[start:end] - target).sum()
        ctx.save_for_backward(hidden, weight, labels, logsumexp)
        ctx.chunk_tokens, ctx.compute_dtype = chunk_tokens, compute_dtype
        return total / n

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:  # type: ignore[override]
        hidden, weight, labels, logsumexp = ctx.saved_tensors
        n, dtype = hidden.shape[0], ctx.compute_dtype
        w = weight.to(dtype)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        scale = grad_loss.float() / n
        for start in range(0, n, ctx.chunk_tokens):
            end = min(start + ctx.chunk_tokens, n)
            h = hidden[start:end].to(dtype)
            # d(mean loss)/d(logits) = (softmax - one-hot) / n, from the saved log-sum-exp.
            grad_logits = torch.exp((h @ w.t()).float() - logsumexp[start:end, None])
            grad_logits[torch.arange(end - start, device=labels.device), labels[start:end]] -= 1.0
            grad_logits = (grad_logits * scale).to(dtype)
            grad_hidden[start:end] = grad_logits @ w
            if dtype == torch.float32:
                grad_weight.addmm_(grad_logits.t(), h)  # in place: no second weight-sized buffer
            else:
                grad_weight += (grad_logits.t() @ h).float()
        return grad_hidden, grad_weight.to(weight.dtype), None, None


def chunked_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_tokens: int
) -> torch.Tensor:
    """Mean cross-entropy of the head `weight` [vocab, h] applied to `hidden` [..., h] against
    `labels` [...], `chunk_tokens` tokens at a time: `F.cross_entropy(hidden @ weight.T, labels)`
    in value and gradients, without the whole logits."""
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    return ChunkedCrossEntropy.apply(hidden.flatten(0, -2), weight, labels.flatten(), chunk_tokens)
