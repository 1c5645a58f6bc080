# The Auto-regressive Encoder-Decoder Transformer write-up's run "with MSE embedding loss and pos
# sub" (its appendix): auto-regressive encoder-decoder, 15,763,500 parameters.
# Published result after 9k steps on one A100: val loss 3.378, train loss 2.982, embedding loss
# 4.673e-9 (the baseline: 3.424; the best run of both write-ups).
#   python train.py config/encdec_mse_possub.py

out_dir = "out-encdec_mse_possub"
model_type = "encdec"

# The model is model_encdec.py's defaults, which are this run: d150 H5, 13 encoder + 13 decoder
# blocks (n_layer counts one stack), position subtraction and an MSE embedding loss of weight 8
# that trains the embeddings, not the encoder.
cross_n_head = 10  # 2 * n_head, what the default None also gives

# The training is train.py's defaults, the settings of every run of the write-ups: 50 batch ×
# 16 accum × 200 tokens = 160,000 tokens per step; × 9000 steps = 1.44B tokens.
