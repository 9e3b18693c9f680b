"""How a training stack runs a step on GPUs: its kernels, its bytes per parameter, what it overlaps.

Two stacks training the same model with the same layout on the same GPUs take different
times and memory: one fuses the bias, dropout and residual add into one pass, another runs
them apart; one keeps an fp32 gradient beside bf16 weights, another fp32 weights under
autocast; one overlaps the gradient reduction with backward, another runs it after. These
are facts of the software (each stated with its source), not fitted figures, and the
planner prices a layout as the named stack runs it (`dt plan --stack`, default dt's own).

Bytes per parameter (mixed precision, Adam): weight_bytes the working copy the matmuls read,
grad_bytes the gradient kept for the optimizer, master_bytes an fp32 master copy (0 when the
weights are the master: dt's autocast keeps float32 weights), moment_bytes Adam's two moments.
Megatron-LM: 2 + 4 + 4 + 8 = 18; with its distributed optimizer (ZeRO-1) 6 + 12 / dp.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["STACKS", "Stack", "stack"]

GIB = 1 << 30


@dataclass(frozen=True)
class Stack:
    name: str
    source: str
    attention: str  # "flash2", "flash3", "cudnn" (fused kernels) or "unfused" (scores GEMM, softmax, GEMM)
    dropout: bool  # dropout after attention's softmax and before each residual add (masks kept)
    fused_elementwise: bool  # bias + activation and bias + dropout + add in one pass each
    weight_bytes: int  # the working copy the matmuls read
    grad_bytes: int  # the gradient the optimizer reads
    master_bytes: int  # an fp32 master copy (0: the weights are the master)
    moment_bytes: int  # Adam's two moments together
    reduce_bytes: int  # bytes per gradient element the data-parallel reduction moves
    overlap_grad_reduce: bool  # the gradient reduction runs behind backward (buckets)
    overlap_param_gather: bool  # a sharded optimizer's all-gather runs behind the next forward
    overlap_tp: bool  # tensor parallel's collectives run behind its GEMMs
    zero1_in_backward: bool = False  # ZeRO 1 reduce-scatters backward's buckets (else one flat call after)
    fsdp_prefetch: bool = False  # ZeRO 3 gathers the next unit behind the current unit's compute
    fsdp_scatter_behind: bool = True  # ZeRO 3's gradient reduce-scatters run behind backward
    fp16_grad_bytes: int = 0  # in fp16, gradients accumulated and reduced in fp16 (0: as in bf16)
    sp_shard_inputs: bool = True  # under sequence parallel a GEMM keeps its input's shard, gathered again
    # in backward (Megatron's); dt's layers keep the gathered input
    sp_norm_grads_each: bool = False  # under sequence parallel each norm's gradients are all-reduced as its
    # backward runs (else coalesced into one call after backward, as Megatron does: priced as nothing)
    reshard_after_forward: bool = True  # ZeRO 3 frees a unit after its forward (and gathers it again)
    scatter_gather_p2p: bool = False  # a pipeline send carries 1/tp of the activation (all-gathered after)
    reduce_once: bool = False  # ZeRO 2 reduce-scatters the gradients once a step, after the last micro-batch
    blocking_p2p: bool = False  # a pipeline send holds its stage until the message is through
    # what the stack runs: the layouts the planner offers on it
    schedules: tuple[str, ...] = ("1f1b", "gpipe", "interleaved")  # () : no pipeline parallel
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    recomputes: tuple[str, ...] = ("none", "selective", "full")
    tensor_parallel: bool = True
    sequence_parallel: bool = True
    context_parallel: bool = True
    partition: str = "blocks"  # a pipeline's cut: blocks evenly, the embedding and head beside the end
    # ones ("blocks"); every layer counting one, the embedding and head included ("layers": dt's); or
    # every layer by its matmuls' weights, the head's V x h against a block's ("weights": nanotron's)
    cast_bytes: int = 0  # autocast's cached low-precision weights, per parameter, during a step
    runtime_bytes: float = 0.0  # CUDA context, NCCL's buffers, library workspaces, per GPU
    fragmentation: float = 1.0  # the caching allocator's reserved over allocated at the peak
    fused_norm: bool = False  # each RMSNorm one kernel keeping its input and rsqrt (dt.cost.activations)
    grad_beside_buckets: bool = False  # DDP's buckets are apart from .grad: under gradient accumulation
    # the micro-batches' summed .grad and the buckets are both live (dt.parallel.data_parallel)
    blockwise_cp_attention: bool = False  # context parallel's attention computes whole score blocks
    # (dt.parallel.context's ring attention and Ulysses), not a fused ring-flash kernel's tiles
    optimizer_copies: int = 0  # temporaries of a stepped tensor's size (in its master precision) the
    # optimizer holds while it steps that tensor, one tensor at a time: dt's written-out Adam makes one
    # (dt.train.optim), Composer's two; a fused kernel none (apex's or Transformer Engine's FusedAdam under
    # Megatron, DeepSpeed's, torch's fused AdamW as torchtitan and nanotron configure it)

    @property
    def causal_skip(self) -> bool:
        """A fused kernel skips the masked half of a causal score matrix; an unfused one computes it."""
        return self.attention != "unfused"

    def runs(self, schedule: str, pp: int, tp: int, cp: int, zero: int, recompute: str,
             sequence_parallel: bool) -> bool:
        """Whether the stack runs a layout with these choices (the planner offers only those)."""
        return ((pp == 1 or schedule in self.schedules) and zero in self.zero_stages
                and recompute in self.recomputes and (tp == 1 or self.tensor_parallel)
                and (not sequence_parallel or self.sequence_parallel) and (cp == 1 or self.context_parallel))

    def at(self, itemsize: int, precision: str = "bf16") -> Stack:
        """The stack training in `precision`: in full precision (`itemsize` 4, fp32 or tf32) the
        weights are their own master, nothing is cast, gradients are reduced as they are; in fp16,
        where the stack keeps its gradients in fp16 (fp16_grad_bytes), those."""
        if itemsize < 4:
            if precision == "fp16" and self.fp16_grad_bytes:
                return replace(self, grad_bytes=self.fp16_grad_bytes, reduce_bytes=self.fp16_grad_bytes)
            return self
        return replace(self, weight_bytes=itemsize, grad_bytes=itemsize, master_bytes=0, cast_bytes=0,
                       reduce_bytes=itemsize)

    def state_bytes(self, zero: int, dp: int) -> float:
        """Bytes per parameter of weights, gradients, master and moments on one rank, ZeRO stage
        `zero` over `dp` ranks: 1 shards the master and moments, 2 the gradients too, 3 the weights."""
        shard = lambda x, stage: x / dp if zero >= stage else x  # noqa: E731
        return (shard(self.weight_bytes, 3) + shard(self.grad_bytes, 2)
                + shard(self.master_bytes + self.moment_bytes, 1))


_CUDA_RUNTIME = ("the CUDA context and cuBLAS workspace (about 0.5-1 GiB per process: PyTorch's CUDA "
                 "semantics notes) and NCCL's buffers (NCCL_BUFFSIZE 4 MiB per channel and peer)")

STACKS: dict[str, Stack] = {
    "dt": Stack(
        "dt", "dt train --device cuda --precision bf16: float32 weights and Adam state, bf16 autocast "
              "(its cast weights cached for the step), torch's SDPA (FlashAttention-2 kernels), eager "
              "elementwise ops, no dropout, DDP's buckets behind backward, FSDP's next unit gathered "
              "behind the current one's compute (its reduce-scatters blocking); " + _CUDA_RUNTIME,
        attention="flash2", dropout=False, fused_elementwise=False, weight_bytes=4, grad_bytes=4,
        master_bytes=0, moment_bytes=8, reduce_bytes=4, overlap_grad_reduce=True,
        overlap_param_gather=False, overlap_tp=False, cast_bytes=2, runtime_bytes=1.5 * GIB,
        fragmentation=1.05, partition="layers", fsdp_prefetch=True, fsdp_scatter_behind=False,
        sp_shard_inputs=False, sp_norm_grads_each=True, grad_beside_buckets=True,
        blockwise_cp_attention=True, optimizer_copies=1),
    "megatron": Stack(
        "megatron", "Megatron-Core with Transformer Engine (NVIDIA/Megatron-LM, 2024): cuDNN's fused "
                    "attention, fused bias-activation and bias-dropout-add, bf16 weights with fp32 "
                    "gradients and an fp32 master and Adam state (its distributed optimizer shards the "
                    "last two: --use-distributed-optimizer), gradients reduced in bucketed "
                    "reduce-scatters behind backward (--overlap-grad-reduce) and parameters gathered behind "
                    "forward (--overlap-param-gather), tensor parallel's collectives behind its GEMMs "
                    "(--tp-comm-overlap); " + _CUDA_RUNTIME,
        schedules=("1f1b", "interleaved"), zero_stages=(0, 1),
        attention="cudnn", dropout=False, fused_elementwise=True, weight_bytes=2, grad_bytes=4,
        master_bytes=4, moment_bytes=8, reduce_bytes=4, overlap_grad_reduce=True,
        overlap_param_gather=True, overlap_tp=True, zero1_in_backward=True, runtime_bytes=1.5 * GIB,
        fragmentation=1.05, scatter_gather_p2p=True),
    "megatron-2021": Stack(
        "megatron-2021", "Megatron-LM as Narayanan et al. 2021 and Korthikanti et al. 2022 ran it: attention "
                         "unfused (a batched GEMM for the scores, Megatron's fused scale-mask-softmax, "
                         "dropout 0.1 on the probabilities and the residual stream, a GEMM for the "
                         "values), fused bias-GeLU and bias-dropout-add, mixed precision with fp32 master "
                         "weights, Adam state and gradient buffers, the data-parallel all-reduce after "
                         "backward (its local DDP), tensor parallel's all-reduces exposed; " + _CUDA_RUNTIME,
        schedules=("1f1b", "interleaved"), zero_stages=(0,), recomputes=("none", "full"),
        sequence_parallel=False, context_parallel=False,
        attention="unfused", dropout=True, fused_elementwise=True, weight_bytes=2, grad_bytes=4,
        master_bytes=4, moment_bytes=8, reduce_bytes=4, overlap_grad_reduce=False,
        overlap_param_gather=False, overlap_tp=False, runtime_bytes=1.5 * GIB, fragmentation=1.05,
        scatter_gather_p2p=True),
}
STACKS["megatron-2022"] = replace(
    STACKS["megatron-2021"], name="megatron-2022", recomputes=("none", "selective", "full"),
    sequence_parallel=True,
    source="Megatron-LM as Korthikanti et al. 2022 ran it: Narayanan et al.'s stack with sequence parallel "
           "and "
           "selective recompute (the attention core's) added")
STACKS |= {
    "megatron-deepspeed": Stack(
        "megatron-deepspeed", "bigscience-workshop/Megatron-DeepSpeed as BLOOM's tr11 ran it (2022): "
                              "Megatron's unfused attention (batched GEMMs and its fused "
                              "scale-mask-softmax), fused bias-GeLU and bias-dropout-add, dropout 0 "
                              "(tr11's configs), DeepSpeed's pipeline engine and ZeRO 1 (fp32 master and "
                              "Adam state sharded over dp), the data-parallel reduction after the last "
                              "micro-batch (fp16 runs accumulate and reduce their gradients in fp16; bf16 "
                              "runs in fp32: its BF16 optimizer's unsharded fp32 gradient buffer, beside "
                              "the bf16 .grad its pipeline engine keeps, update_hp_grads(clear_lp_grads="
                              "False)), tensor parallel's all-reduces exposed, the pipeline's sends and "
                              "receives blocking the stage (its engine's broadcasts); " + _CUDA_RUNTIME,
        schedules=("1f1b",), zero_stages=(0, 1), recomputes=("none", "full"), sequence_parallel=False,
        context_parallel=False,
        attention="unfused", dropout=False, fused_elementwise=True, weight_bytes=2, grad_bytes=4 + 2,
        master_bytes=4, moment_bytes=8, reduce_bytes=4, overlap_grad_reduce=False,
        overlap_param_gather=False, overlap_tp=False, runtime_bytes=1.5 * GIB, fragmentation=1.1,
        blocking_p2p=True, fp16_grad_bytes=2),
    "nanotron": Stack(
        "nanotron", "huggingface/nanotron (2025): flash-attn 2, no dropout, eager elementwise ops but "
                    "fused RMSNorm kernels (TritonRMSNorm), bf16 "
                    "weights with an fp32 gradient accumulator, fp32 master and Adam state (ZeRO 1 shards "
                    "them), tensor parallel in its reduce-scatter (sequence-parallel) mode, the "
                    "data-parallel "
                    "reduction in buckets behind backward, the pipeline cut by its layers' weights "
                    "(build_model's get_block_compute_costs); " + _CUDA_RUNTIME,
        schedules=("1f1b", "gpipe"), zero_stages=(0, 1), recomputes=("none",), context_parallel=False,
        attention="flash2", dropout=False, fused_elementwise=False, weight_bytes=2, grad_bytes=4,
        master_bytes=4, moment_bytes=8, reduce_bytes=4, overlap_grad_reduce=True,
        overlap_param_gather=False, overlap_tp=False, runtime_bytes=1.5 * GIB, fragmentation=1.05,
        partition="weights", fused_norm=True),
    "llm-foundry": Stack(
        "llm-foundry", "mosaicml/llm-foundry (MPT on Composer, 2023): the Triton FlashAttention kernel "
                       "(attn_impl triton), no dropout, "
                       "PyTorch FSDP over every GPU (float32 weights sharded, bf16 compute, gradients "
                       "reduce-scattered in float32), the next unit's all-gather prefetched behind the "
                       "current one's compute, Composer's DecoupledAdamW stepping one flat shard at a "
                       "time (its denominator a square root, then divided: two copies at once); "
                       + _CUDA_RUNTIME,
        schedules=(), zero_stages=(0, 2, 3), recomputes=("none", "full"), tensor_parallel=False,
        sequence_parallel=False, context_parallel=False,
        attention="triton", dropout=False, fused_elementwise=False, weight_bytes=4, grad_bytes=4,
        master_bytes=0, moment_bytes=8, reduce_bytes=4, overlap_grad_reduce=True,
        overlap_param_gather=True, overlap_tp=False, cast_bytes=2, fsdp_prefetch=True,
        runtime_bytes=1.5 * GIB, fragmentation=1.05, optimizer_copies=2),
    "torchtitan": Stack(
        "torchtitan", "pytorch/torchtitan (FSDP2, 2024-25): SDPA's flash kernels, no dropout, float32 "
                      "weights sharded (FSDP2's fully_shard), bf16 compute, gradients reduce-scattered in "
                      "float32, the next unit's all-gather prefetched; " + _CUDA_RUNTIME,
        zero_stages=(0, 3),
        attention="flash2", dropout=False, fused_elementwise=False, weight_bytes=4, grad_bytes=4,
        master_bytes=0, moment_bytes=8, reduce_bytes=4, overlap_grad_reduce=True,
        overlap_param_gather=True, overlap_tp=False, cast_bytes=2, fsdp_prefetch=True,
        runtime_bytes=1.5 * GIB, fragmentation=1.05),
    "llama3": Stack(
        "llama3", "Meta's Llama 3 pre-training (Grattafiori et al. 2024, Section 3.3): tensor parallel with "
                  "sequence parallel, FSDP that shards the optimizer and gradients and keeps the parameters "
                  "gathered from forward to backward, gradients reduce-scattered in fp32, bf16 compute with "
                  "fused attention kernels, no dropout, the data-parallel collectives behind compute; "
                  + _CUDA_RUNTIME,
        schedules=("1f1b", "interleaved"), zero_stages=(2,),
        attention="flash3", dropout=False, fused_elementwise=True, weight_bytes=2, grad_bytes=4,
        master_bytes=4, moment_bytes=8, reduce_bytes=4, overlap_grad_reduce=True,
        overlap_param_gather=True, overlap_tp=False, zero1_in_backward=True, fsdp_prefetch=True,
        reshard_after_forward=False, reduce_once=True, runtime_bytes=1.5 * GIB, fragmentation=1.05),
}


def stack(name: str) -> Stack:
    """A stack by name; one clear line otherwise."""
    if name not in STACKS:
        raise ValueError(f"no stack {name!r}: one of {', '.join(STACKS)}")
    return STACKS[name]
