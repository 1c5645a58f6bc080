# The Encoder-Decoder write-up's next steps: "experiment with unequal encoder and decoder layers,
# ideally allowing the model to learn the ratio" (its runs had "an equal number of encoder and
# decoder layers" for simplicity). config/encdec_mse_possub.py, the best run of both write-ups, with
# 9 encoder and 16 decoder blocks instead of 13 + 13: a deeper decoder, fewer layers of
# "understanding", more of prediction (each decoder block also cross-attends to the encoder output).
# Why 9 + 16: a decoder block (self-attention, cross-attention, MLP: 16 d^2 + 4d) weighs 4/3 of an
# encoder block (12 d^2 + 2d), so trading 4 encoder blocks for 3 decoder blocks keeps the parameter
# count: 15,764,100 parameters, within 600 of encdec_mse_possub's 15,763,500 (the comparison is
# about the ratio, not the size); 25 blocks deep instead of 26. Each stack's residual projections
# are initialized for its own depth, 0.02 / sqrt(2 * 9) and 0.02 / sqrt(2 * 16).
# Auto-regressive encoder-decoder, 15,764,100 parameters, 109,344,600 training FLOPs per token.
#   python train.py config/encdec_mse_possub_enc9_dec16.py
#   python study.py config/encdec_mse_possub.py config/encdec_mse_possub_enc17_dec10.py \
#       config/encdec_mse_possub_enc9_dec16.py --seeds=1337,1338,1339,1340,1341,1342 \
#       --out_root=study-depths --data_dir=data/wikipedia

out_dir = "out-encdec_mse_possub_enc9_dec16"
model_type = "encdec"

# The model is config/encdec_mse_possub.py's, model_encdec.py's defaults (d150 H5, position
# subtraction, an MSE embedding loss of weight 8), with 9 encoder and 16 decoder blocks.
# (n_layer, the depth of both stacks when they are equal, is not used.)
cross_n_head = 10  # 2 * n_head, what the default None also gives
n_layer_encoder = 9
n_layer_decoder = 16

# The training is train.py's defaults, the settings of every run of the write-ups: 50 batch ×
# 16 accum × 200 tokens = 160,000 tokens per step; × 9000 steps = 1.44B tokens.
