"""The future-attention kernels, which model_future_attn.py imports when it finds them."""
