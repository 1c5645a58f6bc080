# The write-ups' run "0.2 dropout baseline" (appendix of both the Future Attention and the
# Encoder-Decoder write-up): baseline GPT, 16,036,800 parameters.
# Published result after 9k steps on one A100: val loss 3.406, train loss 3.174.
#   python train.py config/dropout02_baseline.py

out_dir = "out-dropout02_baseline"

# The model is model_baseline.py's defaults (d160 H10 L26) with dropout.
dropout = 0.2

# The training is train.py's defaults, the settings of every run of the write-ups: 50 batch ×
# 16 accum × 200 tokens = 160,000 tokens per step; × 9000 steps = 1.44B tokens.
