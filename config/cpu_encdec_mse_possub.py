# The Auto-regressive Encoder-Decoder Transformer write-up's best run, "with MSE embedding loss and
# pos sub", in miniature, for the three-model comparison on a CPU (docs/results.md):
# auto-regressive encoder-decoder, 7,239,456 parameters (0.3% more than cpu_baseline's
# 7,220,480), 44,017,344 training FLOPs per token.
#   python train.py config/cpu_encdec_mse_possub.py
#   python study.py config/cpu_baseline.py config/cpu_future16_mse.py \
#       config/cpu_encdec_mse_possub.py --seeds=1337,1338,1339,1340,1341,1342 --out_root=study-cpu

# cpu_baseline's data and training; then what makes it this run
from config.cpu_baseline import *  # noqa: F403

out_dir = "out-cpu_encdec_mse_possub"
model_type = "encdec"

# The baseline's 4 blocks become 2 encoder + 2 decoder blocks (n_layer counts one stack), as the
# write-up's 26 became 13 + 13. A decoder block's cross-attention and the bridge add weights, so
# the width is 126 rather than 128 (its 50,257-token embedding is 100,514 weights lighter): H7,
# head size 18, cross-attention's 14 heads twice as many. Position subtraction and an MSE
# embedding loss of weight 8 are the model's defaults, as in the write-up's run.
n_layer = 2
n_embd = 126
n_head = 7
cross_n_head = 14
