# The write-ups' baseline in miniature, for the three-model comparison on a CPU (docs/results.md):
# baseline GPT, 7,220,480 parameters, 43,716,096 training FLOPs per token.
# Trained on WikiText-2's test split, evaluated on its validation split (data_dir below, which
# docs/results.md prepares), then
#   python train.py config/cpu_baseline.py
#   python study.py config/cpu_baseline.py config/cpu_future16_mse.py \
#       config/cpu_encdec_mse_possub.py --seeds=1337,1338,1339,1340,1341,1342 --out_root=study-cpu

out_dir = "out-cpu_baseline"
# train.bin from WikiText-2's test.txt (277,046 GPT-2 tokens), val.bin from its valid.txt
data_dir = "data/wikitext2_test_valid"

# d128 H8 L4, head size 16 as in the write-ups, a 64-token context. At this width GPT-2's
# 50,257-token output head is 88% of the FLOPs, so a wider model costs little more per token.
block_size = 64
n_layer = 4
n_head = 8
n_embd = 128

# 16 batch × 1 accum × 64 tokens = 1,024 tokens per step; × 800 steps = 819,200 tokens, about
# 3 passes over the training text (the write-ups made 38 over theirs).
batch_size = 16
gradient_accumulation_steps = 1
max_iters = 800
learning_rate = 1e-3  # a small model takes a larger step than the write-ups' 9e-4
min_lr = 1e-4
warmup_iters = 30
lr_decay_iters = 800  # decays to min_lr by the end, so that the last losses are settled
eval_interval = 100
eval_iters = 30  # 30 × 1,024 tokens per split: the same windows for every config of a seed

# system: a CPU, in float32, not compiled (compiling takes longer than a run here)
device = "cpu"
dtype = "float32"
compile = False
