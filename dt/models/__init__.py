"""Models: plain ones (nanogpt.py, llama.py, moe.py, lm.py; no parallelism inside), the mesh GPT (gpt.py),
and generated text (data.py)."""
