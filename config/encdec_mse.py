# The Auto-regressive Encoder-Decoder Transformer write-up's run "with MSE embedding loss" (its
# appendix): auto-regressive encoder-decoder, 15,763,500 parameters.
# Published result after 9k steps on one A100: val loss 3.385, train loss 2.998, embedding loss
# 4.138e-9 (the baseline: 3.424).
#   python train.py config/encdec_mse.py

out_dir = "out-encdec_mse"
model_type = "encdec"

# The model is config/encdec_mse_possub.py's, model_encdec.py's defaults (d150 H5, 13 encoder +
# 13 decoder blocks, an MSE embedding loss), without position subtraction and with the loss at
# weight 1.
cross_n_head = 10  # 2 * n_head, what the default None also gives
sub_pos = "no"
embedding_loss_coeff = 1.0

# The training is train.py's defaults, the settings of every run of the write-ups: 50 batch ×
# 16 accum × 200 tokens = 160,000 tokens per step; × 9000 steps = 1.44B tokens.
