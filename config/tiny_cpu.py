# A tiny model that trains on a CPU in a few minutes: a first run to see everything work.
# Once, a 4.7 MB download that writes data/wikitext2; then the run:
#   python prepare_wikipedia.py --dataset wikitext2
#   python train.py config/tiny_cpu.py
# The other models: add --model_type=future_attn or --model_type=encdec (with encdec,
# n_layer counts each of its two stacks, so --n_layer=2 gives about the same depth) and an
# --out_dir of their own, e.g. --out_dir=out-tiny_encdec.
# 12 batch × 1 accum × 64 tokens = 768 tokens per step; × 300 steps = 230,400 tokens

out_dir = "out-tiny_cpu"
# WikiText-2, detokenized: about 2.4M training tokens, so 300 steps see a tenth of them
data_dir = "data/wikitext2"

# The model: a baseline GPT (the default model_type), d128 H4 L4, 64-token context.
block_size = 64
n_layer = 4
n_head = 4
n_embd = 128

# training
batch_size = 12
gradient_accumulation_steps = 1
max_iters = 300
learning_rate = 1e-3  # a small model takes a larger step
min_lr = 1e-4
warmup_iters = 20
lr_decay_iters = 300  # decays to min_lr by the end
eval_interval = 100
eval_iters = 20

# system
device = "cpu"
dtype = "float32"
compile = False  # compiling takes longer than this whole run on a CPU
