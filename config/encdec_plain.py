# The Auto-regressive Encoder-Decoder Transformer write-up's run "no embedding loss and no pos sub"
# (its appendix): auto-regressive encoder-decoder, 15,763,200 parameters.
# Published result after 9k steps on one A100: val loss 3.413, train loss 3.043
# (the baseline: 3.424).
#   python train.py config/encdec_plain.py

out_dir = "out-encdec_plain"
model_type = "encdec"

# The model is config/encdec_mse_possub.py's, model_encdec.py's defaults (d150 H5, 13 encoder +
# 13 decoder blocks), without position subtraction and without the embedding loss.
cross_n_head = 10  # 2 * n_head, what the default None also gives
sub_pos = "no"
embedding_loss_type = "none"
# No loss, but the original run still built LN_a on E (unused; embedding_ln keeps its default,
# 'init') and not LN_b, which keeps its 15,763,200 parameters.
ln_encoder_out = False
# detach and embedding_loss_coeff do nothing without an embedding loss (the original config left
# them null). The coefficient stays at 1.0, the value this config has always given, so that the
# checkpoints of earlier runs still resume.
embedding_loss_coeff = 1.0

# The training is train.py's defaults, the settings of every run of the write-ups: 50 batch ×
# 16 accum × 200 tokens = 160,000 tokens per step; × 9000 steps = 1.44B tokens.
