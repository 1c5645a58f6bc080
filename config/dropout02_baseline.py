# The write-ups' run "0.2 dropout baseline" (appendix of both the Future Attention and the
# Encoder-Decoder write-up): baseline GPT, 16,036,800 parameters.
# Published result after 9k steps on one A100: val loss 3.406, train loss 3.174.
#   python train.py config/dropout02_baseline.py

out_dir = "out-dropout02_baseline"
model_type = "baseline"

# model: d160 H10 L26
vocab_size = 50257
block_size = 200
n_embd = 160
n_head = 10
n_layer = 26
dropout = 0.2
bias = False

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
