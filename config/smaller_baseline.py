# The write-ups' run "smaller baseline" (appendix of both the Future Attention and the
# Encoder-Decoder write-up): baseline GPT, 15,441,192 parameters.
# Published result after 9k steps on one A100: val loss 3.416, train loss 2.958.
# (fewer parameters than the new models, so a better val loss of theirs is not their size)
#   python train.py config/smaller_baseline.py

out_dir = "out-smaller_baseline"

# d156 H12 L26: narrower than the baseline's d160 H10 (n_layer and the rest are the defaults).
n_embd = 156
n_head = 12

# The training is train.py's defaults, the settings of every run of the write-ups: 50 batch ×
# 16 accum × 200 tokens = 160,000 tokens per step; × 9000 steps = 1.44B tokens.
