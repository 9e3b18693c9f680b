"""The catalogue pricing, term by term, against cases worked by hand: a GEMM's waves and epilogue, an
attention kernel, a memory-bound op (dt.plan.pricing), a layer's kernels (dt.cost.kernels) against
dt.cost.flops' count, and a stack's bytes per parameter (dt.cost.stack)."""

from __future__ import annotations

import math

import pytest

from dt.cost.devices import device
from dt.cost.flops import Decoder, layer_forward
from dt.cost.kernels import Kernel, block_kernels, embedding_kernels, head_kernels, optimizer_bytes
from dt.cost.stack import STACKS
from dt.plan.model import ModelShape, llama_shape
from dt.plan.pricing import kernel_seconds, wave_fill

H100 = device("h100")


def test_the_h100s_figures_the_pricing_reads():
    assert H100.sms == 132 and H100.gemm_tile == (128, 256)  # Hopper's SMs, cuBLAS's bf16 tile
    assert device("a100").sms == 108 and device("a100").gemm_tile == (128, 128)
    assert H100.hbm_efficiency == 0.85 and H100.kernel_overhead == 3e-6


def test_a_grid_of_tiles_runs_in_waves_of_one_tile_per_sm():
    assert wave_fill(132, 132) == 1.0 and wave_fill(264, 132) == 1.0
    assert wave_fill(133, 132) == pytest.approx(133 / 264)  # a second wave for one tile
    assert wave_fill(64, 132) == pytest.approx(64 / 132)  # one wave, half the SMs idle
    assert wave_fill(0, 132) == 1.0


def _gemm(m: int, n: int, k: int) -> Kernel:
    return Kernel("g", "gemm", flops=2.0 * m * n * k, m=m, n=n, k=k, counted=2.0 * m * n * k)


def test_a_square_gemm_pays_its_last_waves_fill_and_its_epilogue():
    """4096^3 bf16 on an H100: 32 x 16 = 512 output tiles of 128 x 256 in 4 waves of 132 (528
    slots), at 57% of 989.4 TFLOP/s; its operands' bytes take less than its products; then its
    output written (2 bytes each) at 85% of 3.35 TB/s, and the gap to the next kernel."""
    rate = 989.4e12 * 0.57
    bandwidth = 3.35e12 * 0.85
    products = 2 * 4096**3 / (rate * 512 / 528)
    operands = 3 * 4096**2 * 2 / bandwidth
    assert operands < products
    epilogue = 4096**2 * 2 / bandwidth
    want = products + epilogue + 3e-6
    assert kernel_seconds(_gemm(4096, 4096, 4096), H100, "bf16", "flash2") == pytest.approx(want, rel=1e-9)
    assert want == pytest.approx(251.3e-6 + 11.78e-6 + 3e-6, rel=1e-3)  # about 266 us


def test_a_narrow_gemm_costs_a_whole_wave_and_a_short_k_its_bytes():
    """tp 8's slice of a 4096-wide GEMM: 32 x 2 = 64 tiles, one wave on 132 SMs, each of its SMs as
    long as a full wave's; a k of 64 moves more bytes than it multiplies: the operands' bytes."""
    rate, bandwidth = 989.4e12 * 0.57, 3.35e12 * 0.85
    narrow = kernel_seconds(_gemm(4096, 512, 4096), H100, "bf16", "flash2")
    products = 2 * 4096 * 512 * 4096 / (rate * 64 / 132)
    assert narrow == pytest.approx(products + 4096 * 512 * 2 / bandwidth + 3e-6, rel=1e-9)
    whole = kernel_seconds(_gemm(4096, 4096, 4096), H100, "bf16", "flash2")
    assert narrow > 1.8 * whole / 8  # an eighth of the work takes almost a quarter of the time
    short = kernel_seconds(_gemm(8192, 8192, 64), H100, "bf16", "flash2")
    operands = (8192 * 64 + 64 * 8192 + 8192 * 8192) * 2 / bandwidth
    assert operands > 2 * 8192 * 8192 * 64 / rate
    assert short == pytest.approx(operands + 8192 * 8192 * 2 / bandwidth + 3e-6, rel=1e-9)


def test_an_attention_kernel_at_its_rate_and_a_memory_op_at_hbms():
    """Llama-7B's fused attention, one 4096-token sequence, 32 heads of 128 on one H100: FlashAttention-2
    computes the unmasked half of 4 s^2 d h FLOPs (MFU counts all of it) at 35% of peak, its 32 x 32
    query tiles in 8 waves of 132; backward 2.5x the work at 30%. Norm 1 reads and writes 4096 x 4096
    bf16 numbers at 85% of HBM."""
    a = llama_shape(32, 32, 4096, 32000).decoder(4096)
    fwd, bwd = block_kernels(a, 1, STACKS["dt"])
    attention = next(k for k in fwd if k.kind == "attention")
    whole = 4 * 4096 * 4096 * 128 * 32
    assert attention.counted == whole and attention.flops == whole / 2 and attention.tiles == 32 * 32
    fill = 1024 / (8 * 132)
    want = whole / 2 / (989.4e12 * 0.35 * fill) + 3e-6
    assert kernel_seconds(attention, H100, "bf16", "flash2") == pytest.approx(want, rel=1e-9)
    back = next(k for k in bwd if k.kind == "attention")
    assert back.flops == 2.5 * whole / 2 and back.counted == 2 * whole and back.backward
    assert kernel_seconds(back, H100, "bf16", "flash2") == pytest.approx(
        2.5 * whole / 2 / (989.4e12 * 0.30 * fill) + 3e-6, rel=1e-9)
    norm = fwd[0]
    assert norm.name == "norm 1" and norm.nbytes == 2 * 2 * 4096 * 4096
    assert kernel_seconds(norm, H100, "bf16", "flash2") == pytest.approx(
        norm.nbytes / (3.35e12 * 0.85) + 3e-6, rel=1e-12)


GPT = ModelShape(2, 8, 512, 1000)
LLAMA_GQA = llama_shape(2, 8, 512, 1000, n_kv_head=2)


@pytest.mark.parametrize("model", [GPT, LLAMA_GQA], ids=["gpt", "llama-gqa"])
@pytest.mark.parametrize("tp,cp", [(1, 1), (2, 1), (1, 2), (2, 2)])
@pytest.mark.parametrize("stack", ["dt", "megatron-2021"])  # fused attention, and scores GEMM + softmax
def test_the_kernels_count_the_flops_dt_cost_flops_counts(model, tp, cp, stack):
    """A layer's kernels, counted as MFU counts them, are dt.cost.flops.layer_forward's FLOPs (3
    sequences); backward counts twice the forward; recompute reruns forward work no MFU counts."""
    a: Decoder = model.decoder(256)
    sequences, st = 3, STACKS[stack]
    fwd, bwd = block_kernels(a, sequences, st, tp, cp)
    assert sum(k.counted for k in fwd) == pytest.approx(sequences * sum(layer_forward(a, 1, tp, cp).values()))
    assert sum(k.counted for k in bwd) == pytest.approx(2 * sum(k.counted for k in fwd))
    head_fwd, head_bwd = head_kernels(a, sequences, tp, cp)
    assert sum(k.counted for k in head_fwd) == pytest.approx(
        sequences * sum(layer_forward(a, a.n_layer + 1, tp, cp).values()))
    assert sum(k.counted for k in head_bwd) == pytest.approx(2 * sum(k.counted for k in head_fwd))
    embed_fwd, embed_bwd = embedding_kernels(a, sequences, cp)
    assert sum(k.counted for k in embed_fwd + embed_bwd) == 0 == sum(layer_forward(a, 0, tp, cp).values())
    core = ("attention", "scores", "softmax", "attention dropout", "values")  # fused, or unfused's kernels
    for recompute, rerun in (("full", fwd), ("selective", [k for k in fwd if k.name in core])):
        _, again = block_kernels(a, sequences, st, tp, cp, recompute=recompute)
        added = again[:len(again) - len(bwd)]
        assert [k.name for k in added] == [k.name + " (recompute)" for k in rerun]
        assert sum(k.counted for k in added) == 0
        assert sum(k.flops for k in added) == pytest.approx(sum(k.flops for k in rerun))


def test_sequence_parallel_puts_the_replicated_stream_on_a_tp_share():
    """Under sp the norms, dropout and residual adds read T / tp tokens; the GEMMs are unchanged."""
    a = GPT.decoder(256)
    plain, _ = block_kernels(a, 2, STACKS["megatron"], tp=2)
    sp, _ = block_kernels(a, 2, STACKS["megatron"], tp=2, sequence_parallel=True)
    for k, s in zip(plain, sp):
        if k.name.startswith(("norm", "residual")):
            assert s.nbytes == pytest.approx(k.nbytes / 2), k.name
        else:
            assert s == k, k.name


@pytest.mark.parametrize("name,zero,want", [
    # Megatron: bf16 weights (2), fp32 gradients (4), an fp32 master (4) and Adam's moments (8) = 18
    ("megatron", 0, 18), ("megatron", 1, 6 + 12 / 8), ("megatron", 2, 2 + 16 / 8), ("megatron", 3, 18 / 8),
    # dt: float32 weights that are their own master (4), float32 gradients (4), moments (8) = 16
    ("dt", 0, 16), ("dt", 1, 8 + 8 / 8), ("dt", 2, 4 + 12 / 8), ("dt", 3, 16 / 8)])
def test_a_stacks_bytes_per_parameter_under_each_zero_stage(name, zero, want):
    assert STACKS[name].state_bytes(zero, 8) == pytest.approx(want)


def test_adam_reads_and_writes_each_stepped_number_as_the_stack_keeps_it():
    """Megatron: reads the fp32 gradient, master and moments (4 + 4 + 8), writes the master and moments
    (4 + 8) and the bf16 working copy (2): 30 bytes; dt's float32 weights are the master: 28; in
    full precision dt is the same 7 float32s."""
    assert optimizer_bytes(STACKS["megatron"]) == 4 + 4 + 8 + 4 + 8 + 2 == 30
    assert optimizer_bytes(STACKS["dt"]) == 4 + 4 + 8 + 4 + 8 == 28
    assert optimizer_bytes(STACKS["dt"].at(4)) == 7 * 4
    assert optimizer_bytes(STACKS["megatron"].at(4)) == 7 * 4  # fp32: no separate master, no cast copy
    assert math.isclose(STACKS["megatron"].at(4).state_bytes(0, 1), 16)
