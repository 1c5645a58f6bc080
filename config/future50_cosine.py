# The Future Attention write-up's run "future_dim = 50 Cosine" (its appendix): future attention,
# 15,817,248 parameters.
# Published result after 9k steps on one A100: val loss 3.423, train loss 3.017, future attention
# loss 0.2589 (the baseline: 3.424).
#   python train.py config/future50_cosine.py

out_dir = "out-future50_cosine"
model_type = "future_attn"

# d144 H9 L28, every layer with future attention (start_layer 1, end_layer unset):
# the model's defaults.
future_dim = 50  # each query sees learned keys for the next 50 positions
future_attn_loss_type = "cosine"

# The training is train.py's defaults, the settings of every run of the write-ups: 50 batch ×
# 16 accum × 200 tokens = 160,000 tokens per step; × 9000 steps = 1.44B tokens.
