# Both write-ups' next steps: "try bigger models, at least GPT-2 size". config/encdec_mse_possub.py
# (the best run of both write-ups) at GPT-2 small scale, to compare with config/gpt2_baseline.py
# (123,551,232 parameters).
# Sizing: as in the write-up (d150, 13 + 13 blocks against the baseline's d160, 26 blocks), the
# two stacks together are as deep as the baseline, 6 + 6 against 12, and a little narrower:
# d720 with H9 (head size 80) and 2 × 9 = 18 cross-attention heads (head size 40), both multiples
# of 8 (d768 would need 5 + 5 blocks to fit: shallower than the baseline). 0.22% above the baseline.
# Auto-regressive encoder-decoder, 123,824,160 parameters, 902,197,440 training FLOPs per token
# (model.flops_per_token(), at T = 1024: three attentions per block pair).
# Memory and step time: not measured yet.
#   python train.py config/gpt2_encdec_mse_possub.py
#   python study.py config/gpt2_baseline.py config/gpt2_future50_mse.py \
#       config/gpt2_encdec_mse_possub.py --seeds=1337 --out_root=study-gpt2 \
#       --data_dir=data/wikitext103

out_dir = "out-gpt2_encdec_mse_possub"
model_type = "encdec"

# The batch and the optimizer of config/gpt2_baseline.py, which explains them: 10 batch × 16
# accum × 1024 tokens = 163,840 tokens per step, 9000 steps.
block_size = 1024
batch_size = 10

# The model: d720 H9, 6 encoder + 6 decoder blocks (n_layer counts one stack), with
# model_encdec.py's position subtraction and MSE embedding loss of weight 8.
n_embd = 720
n_head = 9
n_layer = 6
cross_n_head = 18

# The optimizer at GPT-2 small scale, the same for all three gpt2_* configs.
learning_rate = 6e-4
min_lr = 6e-5
warmup_iters = 1000
lr_decay_iters = 9000
grad_clip = 1.0
