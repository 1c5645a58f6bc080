# The Future Attention write-up's first next step: "let K_future and V_future be computed values
# (just like Q, K, and V). Should also do this in a parameter count efficient way (ideally reusing
# or closely deriving from K and V)"; its conclusion blames the weak result first on "bad K_future
# and V_future construction": "the parametrization of K_future and V_future deprives them of
# in-context information". config/future50_mse.py with future_kv = "computed": query i's future
# key and value at offset o = 1..50 are k_i + K_offset[o-1] and v_i + V_offset[o-1], built from
# its own token (so still causal).
# Future attention, 14,615,712 parameters: K_offset and V_offset hold 2 * 144 * 50 per layer
# where K_future and V_future held 2 * 144 * 199, so 1,201,536 fewer than future50_mse's
# 15,817,248 (and fewer than the smaller baseline's 15,441,192).
# 98,983,872 training FLOPs per token.
# Only the readable future attention computes it: slower than future50_mse's fast paths.
#   python train.py config/future50_mse_computed.py
#   python study.py config/future50_mse.py config/future50_mse_computed.py \
#       config/smaller_baseline.py --seeds=1337,1338,1339,1340,1341,1342 \
#       --out_root=study-computed --data_dir=data/wikipedia

out_dir = "out-future50_mse_computed"
model_type = "future_attn"

# d144 H9 L28, every layer with future attention (start_layer 1, end_layer unset):
# the model's defaults.
future_dim = 50  # each query predicts its scores against the next 50 positions
# k_i + K_offset[o-1], v_i + V_offset[o-1] instead of learned K_future, V_future
future_kv = "computed"

# The training is train.py's defaults, the settings of every run of the write-ups: 50 batch ×
# 16 accum × 200 tokens = 160,000 tokens per step; × 9000 steps = 1.44B tokens.
