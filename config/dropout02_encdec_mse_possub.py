# The Encoder-Decoder write-up's next steps: "dropout is known to improve validation loss, but it
# was not used here for simplicity, except in the baseline. The new architecture should also be
# tested with dropout". config/encdec_mse_possub.py (the best run of both write-ups) with dropout
# 0.2, as config/dropout02_baseline.py is config/baseline.py with dropout 0.2. Dropout is on in
# training only (every dropout, attention's included, is off in eval mode, unlike the original
# evaluation).
# Auto-regressive encoder-decoder, 15,763,500 parameters, 108,621,000 training FLOPs per token.
#   python train.py config/dropout02_encdec_mse_possub.py
#   python study.py config/encdec_mse_possub.py config/dropout02_encdec_mse_possub.py \
#       config/baseline.py config/dropout02_baseline.py --seeds=1337,1338,1339,1340,1341,1342 \
#       --out_root=study-dropout --data_dir=data/wikipedia

out_dir = "out-dropout02_encdec_mse_possub"
model_type = "encdec"

# The model is config/encdec_mse_possub.py's, model_encdec.py's defaults (d150 H5, 13 encoder +
# 13 decoder blocks, position subtraction, an MSE embedding loss of weight 8), with dropout.
cross_n_head = 10  # 2 * n_head, what the default None also gives
dropout = 0.2

# The training is train.py's defaults, the settings of every run of the write-ups: 50 batch ×
# 16 accum × 200 tokens = 160,000 tokens per step; × 9000 steps = 1.44B tokens.
