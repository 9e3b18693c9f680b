"""dt.bench.step_profile: a training step's time by kind of kernel (on the CPU here: its operators)."""

from __future__ import annotations

import pytest

from dt.bench.step_profile import kernel_kind, main


@pytest.mark.parametrize("name, kind", [
    ("nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_NNT", "matmul"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16", "attention"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>", "elementwise"),
    ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<float>", "other"),
    ("aten::layer_norm", "norm"),
    ("autograd::engine::evaluate_function: MmBackward0", "matmul"),
    ("Memcpy HtoD (Pageable -> Device)", "copy"),
])
def test_kernels_are_sorted_by_what_they_do(name, kind):
    assert kernel_kind(name) == kind


@pytest.mark.timeout(120)
def test_a_step_is_split_into_kinds_that_sum_to_its_kernels(capsys):
    assert main(["--device", "cpu", "--steps", "3", "--warmup", "1", "--profile-steps", "1",
                 "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--batch-size", "2",
                 "--block-size", "8", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    head = lines[0]
    total = float(head.split(", ")[1].split(" ms")[0])
    shares = [float(line.split()[1]) for line in lines[1:] if line.startswith("  ") and " ms " in line
              and "%" in line]
    assert "rank 0 on cpu" in head and "matmul" in out and sum(shares) == pytest.approx(total, abs=0.05)
