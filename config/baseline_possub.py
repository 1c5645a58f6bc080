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

# The model is config/baseline.py's, model_baseline.py's defaults (d160 H10 L26), with one change.
sub_pos = "yes"  # logits = (ln_f(x) - wpe[1..T]) @ wte^T

# The training is train.py's defaults, the settings of every run of the write-ups: 50 batch ×
# 16 accum × 200 tokens = 160,000 tokens per step; × 9000 steps = 1.44B tokens.
