"""The kernels one rank's GPU runs for a decoder layer: each GEMM's shape, each attention kernel's
work, each memory-bound op's bytes. What a FLOP count cannot see is here: norms, activations,
residual adds, dropout, the loss's softmax, casts; dt.plan.pricing turns the list into seconds.

    fwd, bwd = block_kernels(arch, sequences=1, stack=STACKS["megatron"], tp=8)
    sum(k.counted for k in fwd)      # = dt.cost.flops.layer_forward(arch, 1, tp=8): the same count

Per micro-batch on one rank: T = sequences x s / cp tokens, h hidden, a heads (kv of them for
keys and values), d = h / a, f the MLP's width, t = tp, e the activation itemsize. Sequence
parallel puts the norms, dropout and residual adds on T / t tokens. One block's forward:

    norm 1           memory  read x, write y                    2 e T h   (/ t with sp)
    qkv              GEMM    [T, h] x [h, (a + 2 kv) d / t]
    attention        fused (flash): one kernel, 4 T s_k d a / t FLOPs, half of it under a
                     causal mask; unfused: scores GEMM, softmax (read, write e a/t s^2 b),
                     dropout of the probabilities, values GEMM
    out_proj         GEMM    [T, h/t] x [h/t, h]
    residual 1       memory  bias + dropout + add: read 2, write 1 (+ the mask's byte)
    norm 2, fc1      [T, h] x [h, f / t] (gated: 2 f / t), activation (gelu: read, write;
    swiglu: read 2, write 1), fc2 [T, f/t] x [f/t, h], residual 2

Backward: each GEMM twice (the input's gradient and the weight's, each as many FLOPs), a
fused attention kernel 2.5x its forward's work (it recomputes the scores: FlashAttention-2's
count), each memory op reads what it saved and the incoming gradient and writes a gradient.
Recompute adds forward kernels before the backward: "full" the whole block's, "selective"
the attention core's (Korthikanti et al. 2022).
"""

from __future__ import annotations

from dataclasses import dataclass

from dt.cost.flops import Decoder
from dt.cost.stack import Stack

__all__ = ["Kernel", "block_kernels", "embedding_kernels", "head_kernels", "optimizer_bytes"]

FLASH_BACKWARD = 2.5  # a fused attention backward's work over its forward's (it recomputes the scores)


@dataclass(frozen=True)
class Kernel:
    """One kernel: a GEMM (m x k by k x n, `batch` of them), an attention kernel or a memory-bound op."""

    name: str
    kind: str  # "gemm", "attention" or "memory"
    flops: float = 0.0  # what the kernel executes (a causal fused attention: half the scores)
    nbytes: float = 0.0  # memory: bytes read and written
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    counted: float = 0.0  # the FLOPs MFU's convention counts for it (the whole s x s score matrix)
    tiles: int = 0  # attention: independent (sequence, head, query block) tiles, for the waves
    backward: bool = False  # attention: a backward kernel (it runs at its own rate)


def _gemm(name: str, m: float, n: float, k: float, batch: float = 1) -> Kernel:
    m, n, k, batch = int(m), int(n), int(k), max(1, int(batch))
    flops = 2.0 * m * n * k * batch
    return Kernel(name, "gemm", flops=flops, m=m, n=n, k=k, batch=batch, counted=flops)


def _memory(name: str, nbytes: float) -> Kernel:
    return Kernel(name, "memory", nbytes=float(nbytes))


def _gemm_backward(g: Kernel) -> list[Kernel]:
    """The input's gradient [m, n] x [n, k] and the weight's [k, m] x [m, n]: each g's FLOPs."""
    return [_gemm(g.name + " dgrad", g.m, g.k, g.n, g.batch),
            _gemm(g.name + " wgrad", g.k, g.n, g.m, g.batch)]


QUERY_BLOCK = 128  # a fused attention kernel's query rows per tile (FlashAttention's block)


def _attention(a: Decoder, sequences: int, tp: int, cp: int, stack: Stack,
               e: int) -> tuple[list[Kernel], list[Kernel]]:
    """(forward, backward) of attention's core: queries of this rank's s / cp tokens against
    every key of the sequence (ring attention visits them all), the heads / tp on this rank."""
    s, d, heads = a.seq_len, a.head_dim, a.n_head // tp
    q = s // cp
    counted = 4.0 * sequences * heads * q * s * d  # QK^T and AV, the whole matrix: MFU's count
    if stack.attention != "unfused":
        done = counted * (0.5 if stack.causal_skip else 1.0)  # the masked half is skipped
        tiles = sequences * heads * -(-q // QUERY_BLOCK)
        fwd = Kernel("attention", "attention", flops=done, counted=counted, tiles=tiles)
        bwd = Kernel("attention bwd", "attention", flops=FLASH_BACKWARD * done, counted=2 * counted,
                     tiles=tiles, backward=True)
        return [fwd], [bwd]
    batch = sequences * heads
    scores, values = _gemm("scores", q, s, d, batch), _gemm("values", q, d, s, batch)
    probs = batch * q * s  # elements of the score matrix on this rank
    fwd = [scores, _memory("softmax", 2 * e * probs)]
    bwd = []
    if stack.dropout:
        fwd.append(_memory("attention dropout", (2 * e + 1) * probs))
        bwd.append(_memory("attention dropout bwd", (2 * e + 1) * probs))
    fwd.append(values)
    bwd = _gemm_backward(values) + bwd + [_memory("softmax bwd", 3 * e * probs)] + _gemm_backward(scores)
    return fwd, bwd


def block_kernels(a: Decoder, sequences: int, stack: Stack, tp: int = 1, cp: int = 1,
                  sequence_parallel: bool = False, recompute: str = "none",
                  itemsize: int = 2) -> tuple[list[Kernel], list[Kernel]]:
    """(forward, backward) kernels of one block on one rank for `sequences` sequences (recompute's
    rerun forward kernels at the head of the backward list)."""
    e, h, t = itemsize, a.n_embd, tp
    tokens = sequences * a.seq_len // cp
    row = tokens * h / (t if sequence_parallel else 1)  # elements of the replicated stream
    mask = 1 if stack.dropout else 0
    width = (2 if a.gated else 1) * a.ffn_hidden // t
    core_fwd, core_bwd = _attention(a, sequences, t, cp, stack, e)
    qkv = _gemm("qkv", tokens, (a.n_head + 2 * a.n_kv_head) * a.head_dim // t, h)
    out = _gemm("out_proj", tokens, h, a.n_head * a.head_dim // t)
    fc1, fc2 = _gemm("fc1", tokens, width, h), _gemm("fc2", tokens, h, a.ffn_hidden // t)
    act = (3 if a.gated else 2) * e * tokens * a.ffn_hidden / t  # swiglu reads 2 writes 1; gelu 1, 1
    if a.bias and not stack.fused_elementwise:  # the biases added in passes of their own
        act += 2 * e * tokens * a.ffn_hidden / t
        mask += 2 * e
    fwd = [_memory("norm 1", 2 * e * row), qkv, *core_fwd, out, _memory("residual 1", (3 * e + mask) * row),
           _memory("norm 2", 2 * e * row), fc1, _memory("activation", act), fc2,
           _memory("residual 2", (3 * e + mask) * row)]
    bwd = [_memory("residual 2 bwd", (2 * e + mask) * row), *_gemm_backward(fc2),
           _memory("activation bwd", (5 if a.gated else 3) * e * tokens * a.ffn_hidden / t),
           *_gemm_backward(fc1), _memory("norm 2 bwd", 3 * e * row),
           _memory("residual 1 bwd", (2 * e + mask) * row), *_gemm_backward(out), *core_bwd,
           *_gemm_backward(qkv), _memory("norm 1 bwd", 3 * e * row)]
    if recompute == "full":
        bwd = [_rerun(k) for k in fwd] + bwd
    elif recompute == "selective":
        bwd = [_rerun(k) for k in core_fwd] + bwd
    return fwd, bwd


def _rerun(k: Kernel) -> Kernel:
    """A forward kernel run again for recompute: the same work, counted by no MFU."""
    return Kernel(k.name + " (recompute)", k.kind, k.flops, k.nbytes, k.m, k.n, k.k, k.batch, 0.0, k.tiles)


def head_kernels(a: Decoder, sequences: int, tp: int = 1, cp: int = 1,
                 itemsize: int = 2) -> tuple[list[Kernel], list[Kernel]]:
    """(forward, backward) of the final norm, the vocabulary-parallel logits and the loss: the
    loss reads the logits in float32 (max, exponentials' sum) and writes their gradient."""
    e, tokens = itemsize, sequences * a.seq_len // cp
    logits = _gemm("logits", tokens, a.vocab_size // tp, a.n_embd)
    slice_ = tokens * a.vocab_size / tp
    fwd = [_memory("final norm", 2 * e * tokens * a.n_embd), logits,
           _memory("cross-entropy", (2 * e + 4) * slice_)]
    bwd = [_memory("cross-entropy bwd", (4 + e) * slice_), *_gemm_backward(logits),
           _memory("final norm bwd", 3 * e * tokens * a.n_embd)]
    return fwd, bwd


def embedding_kernels(a: Decoder, sequences: int, cp: int = 1,
                      itemsize: int = 2) -> tuple[list[Kernel], list[Kernel]]:
    """(forward, backward): the rows looked up (and positions added), their gradient scattered back."""
    rows = sequences * a.seq_len // cp * a.n_embd
    return [_memory("embedding", 3 * itemsize * rows)], [_memory("embedding bwd", 2 * (itemsize + 4) * rows)]


def optimizer_bytes(stack: Stack) -> float:
    """Bytes Adam reads and writes per parameter it steps: the gradient, the master weight and both
    moments read; the master, the moments and the model's working copy written (stack's widths)."""
    master = stack.master_bytes or stack.weight_bytes  # no separate master: the weights are it
    written_copy = stack.weight_bytes if stack.master_bytes else 0
    return stack.grad_bytes + 2 * master + 2 * stack.moment_bytes + written_copy
