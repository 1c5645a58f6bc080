# Both write-ups' next steps: "try bigger models, at least GPT-2 size". The reference of the three
# gpt2_* configs: GPT-2 small's shape, d768 H12 L12, at its context 1024. gpt2_future50_mse.py and
# gpt2_encdec_mse_possub.py are sized to within 0.5% of its parameters, as the write-ups compared
# models of about equal size.
# Baseline GPT, 123,551,232 parameters (GPT-2 small's 124M less the position table and biases),
# 854,553,600 training FLOPs per token (model.flops_per_token(), at T = 1024).
# Memory and step time: not measured yet.
#   python train.py config/gpt2_baseline.py
#   python study.py config/gpt2_baseline.py config/gpt2_future50_mse.py \
#       config/gpt2_encdec_mse_possub.py --seeds=1337 --out_root=study-gpt2 \
#       --data_dir=data/wikitext103

out_dir = "out-gpt2_baseline"

# The batch. 160,000 tokens per step does not divide into 1024-token rows (156.25), so the
# nearest whole count with the write-ups' 16 micro-steps (the default, divisible by 1, 2, 4 or
# 8 GPUs): 10 batch × 16 accum × 1024 tokens = 163,840 tokens per step; × 9000 steps (the
# default) = 1.47B tokens (the write-ups': 1.44B). That is about 13 passes over WikiText-103's
# train split (prepared with --dataset=wikitext103 and read with --data_dir=data/wikitext103, as
# in the study command above), 38.5 over the write-ups' text, the default data (theirs: 37.6 over
# their text). eval_iters stays 200: 200 × 10 × 1024 = 2M tokens per split per estimate.
block_size = 1024  # GPT-2's context
batch_size = 10  # per micro-step; memory at this size: not measured yet

# The model: GPT-2 small, d768 H12 L12 (head size 64), a baseline GPT (the default model_type).
n_embd = 768
n_head = 12
n_layer = 12

# The optimizer at GPT-2 small scale, the same for all three gpt2_* configs. The learning rate
# is the GPT-3 paper's for its 125M model, nanoGPT's for GPT-2 small (9e-4 was for 16M models),
# and min_lr is learning_rate / 10, as in the write-ups. The warmup, 1000 steps, is 164M tokens,
# 11% of the run: longer than the small models' 300 steps. The rate decays along a cosine down to
# min_lr at the last step (the write-ups' 700,000 kept the peak rate). GPT-2-scale runs clip the
# gradient norm at 1.0; the write-ups' small models did not clip. The rest (weight decay,
# betas, evaluations) are train.py's defaults, the write-ups' settings.
learning_rate = 6e-4
min_lr = 6e-5
warmup_iters = 1000
lr_decay_iters = 9000
grad_clip = 1.0
