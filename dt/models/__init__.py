"""Models, plain (no parallelism inside): the GPT dt trains (gpt.py), a Llama-style decoder (llama.py),
the mixture of experts (moe.py), what they share (lm.py), and generated text (data.py)."""
