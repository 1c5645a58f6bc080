# The Future Attention write-up's run "future_dim = 50 Cosine" (its appendix): future attention,
# 15,817,248 parameters.
# Published result after 9k steps on one A100: val loss 3.423, train loss 3.017, future attention
# loss 0.2589 (the baseline: 3.424).
#   python train.py config/future50_cosine.py

out_dir = "out-future50_cosine"
model_type = "future_attn"

# model: d144 H9 L28, every layer with future attention
vocab_size = 50257
block_size = 200
n_embd = 144
n_head = 9
n_layer = 28
dropout = 0.0
bias = False
future_dim = 50  # each query sees learned keys for the next 50 positions
start_layer = 1  # to the last layer: end_layer left unset
future_attn_loss_type = "cosine"
future_attn_loss_coeff = 1.0
use_future_attn_loss = True
detach_future_ground_truth = True

# training: the settings common to every run of the write-ups
# 50 batch × 16 accum × 200 tokens = 160,000 tokens per step; × 9000 steps = 1.44B tokens
batch_size = 50
gradient_accumulation_steps = 16  # total over all GPUs: 8 GPUs run 2 micro-steps each
max_iters = 9000
learning_rate = 9e-4
min_lr = 9e-5
warmup_iters = 300
lr_decay_iters = 700_000
decay_lr = True
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 0.0  # the write-ups did not clip
eval_interval = 500
eval_iters = 200
