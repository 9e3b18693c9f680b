"""`dt sample`: a dt train checkpoint, saved on a mesh, back as the plain model in one process.

The twin: the plain model assembled from a tp x pp checkpoint must give, on the
validation batches, the validation loss the mesh measured at its last step
(float64: the same numbers, summed in another order).
"""

from __future__ import annotations

import pytest
import torch

from dt import train
from dt.models.lm import lm_loss
from dt.train.dataset import open_data
from dt.train.sample import load_model, main

ARGV = ["--steps", "4", "--batch-size", "8", "--block-size", "8", "--n-layer", "2", "--n-head", "4",
        "--n-embd", "16", "--dtype", "float64", "--no-progress", "--threads", "1", "--micro-batches", "2",
        "--eval-every", "4", "--eval-batches", "2"]


def _train(argv: list[str]) -> dict:
    return train.train_worker(train.parse_args(ARGV + argv))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_a_mesh_checkpoint_samples_as_the_plain_model(run, tmp_path, model):
    ckpt = str(tmp_path / "ckpt")
    out = run(4, _train, ["--tp", "2", "--pp", "2", "--model", model, "--checkpoint", ckpt])[0]
    (step, mesh_val), = out["val_losses"]
    plain, tokenizer, saved_step = load_model(ckpt)
    assert saved_step == step == 4 and tokenizer.kind == "chars"
    args = train.parse_args(ARGV)
    data = open_data(args)
    losses = []
    with torch.no_grad():
        for i in range(2):
            x, y = data.val_batch(i, 8, 8)
            losses.append(lm_loss(plain(x)[0], y).item())
    assert sum(losses) / 2 == pytest.approx(mesh_val, rel=1e-9)
    prompt = torch.tensor([tokenizer.encode("The cat")])
    a = plain.generate(prompt, 12, 0.8, 5, generator=torch.Generator().manual_seed(1))
    b = plain.generate(prompt, 12, 0.8, 5, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.shape == (1, 7 + 12)


@pytest.mark.timeout(200)
def test_the_command_prints_the_prompt_and_its_continuation(run, tmp_path, capsys):
    ckpt = str(tmp_path / "ckpt")
    run(1, _train, ["--checkpoint", ckpt])
    assert main(["--checkpoint", ckpt, "--prompt", "The dog", "--max-new-tokens", "20", "--temperature", "0",
                 "--samples", "2"]) == 0
    out = capsys.readouterr()
    texts = [t for t in out.out.split("--- sample ")[1:]]
    assert len(texts) == 2 and all(t.split("\n", 1)[1].startswith("The dog") for t in texts)
    assert texts[0].split("\n", 1)[1] == texts[1].split("\n", 1)[1]  # temperature 0: greedy, the same
    assert "step 4" in out.err and "top-k - (every token)" in out.err  # no "top-k None"
    # bad input: one line, exit 2
    for argv, words in ((["--checkpoint", str(tmp_path / "none")], "holds no checkpoint"),
                        (["--checkpoint", ckpt, "--prompt", "Zebra!"], "outside the model's alphabet"),
                        (["--checkpoint", ckpt, "--prompt", ""], "--prompt is empty")):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, err
