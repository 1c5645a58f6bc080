# The Encoder-Decoder write-up's conclusion: "positional embedding subtraction should work even
# for decoder-only transformers, and experiments should validate this".
# config/baseline.py with sub_pos = "yes": before the tied head, the positions of the next tokens,
# wpe[1..T], are subtracted (exactly as in config/encdec_possub.py; the position table gets one
# more row, C+1, which the parameter count leaves out like the rest of the table).
# Baseline GPT, 16,036,800 parameters (the baseline's). 106,204,800 training FLOPs per token.
#   python train.py config/baseline_possub.py
#   python study.py config/baseline.py config/baseline_possub.py \
#       --seeds=1337,1338,1339,1340,1341,1342 --out_root=study-possub --data_dir=data/wikipedia

out_dir = "out-baseline_possub"
model_type = "baseline"

# model: d160 H10 L26
vocab_size = 50257
block_size = 200
n_embd = 160
n_head = 10
n_layer = 26
dropout = 0.0
bias = False
sub_pos = "yes"  # logits = (ln_f(x) - wpe[1..T]) @ wte^T

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
