# The Future Attention write-up's best run, "future_dim = 50 MSE", in miniature, for the
# three-model comparison on a CPU (docs/results.md): future attention, 7,284,992 parameters (0.9%
# more than cpu_baseline's 7,220,480: K_future and V_future add 2 · 128 · 63 per layer),
# 44,168,704 training FLOPs per token.
#   python train.py config/cpu_future16_mse.py
#   python study.py config/cpu_baseline.py config/cpu_future16_mse.py \
#       config/cpu_encdec_mse_possub.py --seeds=1337,1338,1339,1340,1341,1342 --out_root=study-cpu

# cpu_baseline's data, model size and training; then what makes it this run
from config.cpu_baseline import *  # noqa: F403

out_dir = "out-cpu_future16_mse"
model_type = "future_attn"

# d128 H8 L4 as the baseline, every layer with future attention. The write-up's 50 future keys
# are a quarter of its 200-token context: here a quarter of 64. The loss is MSE, of weight 1.
future_dim = 16
