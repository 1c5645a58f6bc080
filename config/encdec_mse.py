# The Auto-regressive Encoder-Decoder Transformer write-up's run "with MSE embedding loss" (its
# appendix): auto-regressive encoder-decoder, 15,763,500 parameters.
# Published result after 9k steps on one A100: val loss 3.385, train loss 2.998, embedding loss
# 4.138e-9 (the baseline: 3.424).
#   python train.py config/encdec_mse.py

out_dir = "out-encdec_mse"
model_type = "encdec"

# model: d150 H5, 13 encoder + 13 decoder blocks (n_layer counts one stack)
vocab_size = 50257
block_size = 200
n_embd = 150
n_head = 5
n_layer = 13
dropout = 0.0
bias = False
cross_n_head = 10
order = "original"
ln_before_bridge = False
add_pos_to_decoder = False
sub_pos = "no"
embedding_loss_type = "mse"
embedding_loss_coeff = 1.0
detach = "encoder_out"  # the embedding loss trains the embeddings, not the encoder
ln_encoder_out = True
embedding_ln = "init"

# training: the settings common to every run of the write-ups
# 50 batch × 16 accum × 200 tokens = 160,000 tokens per step; × 9000 steps = 1.44B tokens
batch_size = 50
gradient_accumulation_steps = 16  # total over all GPUs: 8 GPUs run 2 micro-steps each
max_iters = 9000
learning_rate = 9e-4
min_lr = 9e-5
warmup_iters = 300
lr_decay_iters = 700_000
decay_lr = True
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 0.0  # the write-ups did not clip
eval_interval = 500
eval_iters = 200
