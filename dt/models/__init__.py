"""Models trained on a mesh: a small GPT (gpt.py) and its generated text data (data.py)."""
