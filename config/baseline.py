# The write-ups' run "baseline" (appendix of both the Future Attention and the Encoder-Decoder
# write-up): baseline GPT, 16,036,800 parameters.
# Published result after 9k steps on one A100: val loss 3.424, train loss 2.937.
#   python train.py config/baseline.py

out_dir = "out-baseline"

# The model is model_baseline.py's defaults: d160 H10 L26, no dropout.

# The training is train.py's defaults, the settings of every run of the write-ups: 50 batch ×
# 16 accum × 200 tokens = 160,000 tokens per step; × 9000 steps = 1.44B tokens.
