"""At scale, on paper: the planner beside published large runs (Megatron-LM 2021 Table 1, Llama 3 Table 4).

The errors are what the planner gets today, stated, not a tolerance it is tuned to: per-GPU
TFLOP/s predicted for the authors' layout on the catalogue cluster (stated efficiency, not
measured) were +55% .. -21% against Megatron-LM's ten rows (over-predicted for small models,
where the paper's figures include what the model leaves out: data loading, the optimizer's
fp32 copies, kernel launch gaps) and -8% .. -53% against Llama 3's three (the 131k-token cp=16
row worst: ring attention's hops are priced as exposed, not hidden behind attention).
"""

from __future__ import annotations

import pytest

from dt.plan.atscale import compare
from dt.plan.published_tables import LLAMA3_2024, MEGATRON_2021

MEASURED_WORST = 0.6  # |predicted - published| / published, the worst row measured (55%)


@pytest.mark.parametrize("run", MEGATRON_2021 + LLAMA3_2024, ids=lambda r: f"{r.params / 1e9:.0f}B-{r.gpus}")
def test_each_published_row_beside_the_planners_figure(run):
    c = compare(run, search=False)
    print(f"{run.source}: {run.params / 1e9:.1f}B on {run.gpus} {run.device}, {c.authors}: published "
          f"{run.tflops_per_gpu} TFLOP/s per GPU, planned {c.predicted_tflops:.1f} ({100 * c.error:+.0f}%)")
    assert abs(c.error) < MEASURED_WORST


@pytest.mark.timeout(300)
def test_the_first_ranked_layout_beside_the_authors():
    run = MEGATRON_2021[0]  # 1.7B on 32 A100s: dp 32 (their layout), every layout enumerable
    c = compare(run, search=True)
    assert c.first is not None
    print(f"authors ran {c.authors} ({run.tflops_per_gpu} TFLOP/s per GPU, planned step {c.step:.2f} s); "
          f"the planner ranks first {c.first} ({c.first_step:.2f} s)")
    assert c.first_step <= c.step  # the authors' layout is one of the candidates the search ranked
