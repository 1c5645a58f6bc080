# Both write-ups' next steps: "try bigger models, at least GPT-2 size". config/future50_mse.py at
# GPT-2 small scale, to compare with config/gpt2_baseline.py (123,551,232 parameters).
# Sizing: K_future and V_future grow with the context, 2 * d * (C-1) per layer, 1.57M per layer
# at d768 and C = 1024 (18.9M in all, +15%); the write-ups made future attention narrower
# (d144 against the baseline's d160), and so does this config: d704 H11 L12 keeps the depth and
# the head size 64 (FlexAttention's kernels want a power of 2) and lands 0.41% above the baseline.
# Future attention, 124,051,840 parameters, 865,421,568 training FLOPs per token
# (model.flops_per_token(), at T = 1024).
# Memory and step time: not measured yet.
#   python train.py config/gpt2_future50_mse.py
#   python study.py config/gpt2_baseline.py config/gpt2_future50_mse.py \
#       config/gpt2_encdec_mse_possub.py --seeds=1337 --out_root=study-gpt2 \
#       --data_dir=data/wikitext103

out_dir = "out-gpt2_future50_mse"
model_type = "future_attn"

# The batch and the optimizer of config/gpt2_baseline.py, which explains them: 10 batch × 16
# accum × 1024 tokens = 163,840 tokens per step, 9000 steps.
block_size = 1024
batch_size = 10

# The model: d704 H11 L12 (head size 64), every layer with future attention.
n_embd = 704
n_head = 11
n_layer = 12
future_dim = 50  # the write-up's best: each query predicts its scores against the next 50 positions

# The optimizer at GPT-2 small scale, the same for all three gpt2_* configs.
learning_rate = 6e-4
min_lr = 6e-5
warmup_iters = 1000
lr_decay_iters = 9000
grad_clip = 1.0
