"""
Trains one of the three models (baseline, future attention, auto-regressive encoder-decoder) on
the token files of prepare_wikipedia.py. DEFAULTS are the write-ups' training settings, the
model's are its GPTConfig's; a config file and --key=value flags change any of them.

    python train.py config/tiny_cpu.py                         # a CPU, a few minutes
    python train.py config/future50_mse.py                     # one GPU: compile + bf16
    python train.py config/future50_mse.py --init_from=resume  # go on from out_dir/ckpt.pt
    python train.py config/tiny_cpu.py --help                  # every key with its value
    torchrun --standalone --nproc_per_node=8 train.py config/future50_mse.py   # 8 GPUs

Rank 0 logs, and saves ckpt.pt at every evaluation and best.pt when val improved. Ctrl-C stops
after the step, its state saved.
"""

import itertools
import math
import os
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import configurator
from lib import checkpoint, cli, data, guards, log, machine, settings

# --------------------------------------------------------------------------------------
# the settings

DEFAULTS = dict(
    model_type="baseline",  # 'baseline', 'future_attn' or 'encdec': which model_<type>.py
    # I/O
    data_dir=data.DEFAULT_DATA_DIR,  # train.bin and val.bin of prepare_wikipedia.py
    out_dir="out",  # gets log.jsonl, ckpt.pt (the latest state) and best.pt (the best model)
    eval_interval=500,  # optimizer steps between evaluations and saves
    eval_iters=200,  # batches per split per evaluation
    log_interval=10,  # optimizer steps between train records
    eval_only=False,  # with init_from='resume': evaluate ckpt.pt once and exit
    init_from="scratch",  # 'scratch' or 'resume' (from out_dir/ckpt.pt)
    overwrite=False,  # let a new run delete the run in out_dir
    new_data=False,  # with init_from='resume': go on with other data than the checkpoint's
    wandb_log=False,  # also log to Weights & Biases (needs `pip install wandb`)
    wandb_project="transformer-ideas",
    wandb_run_name="run",
    # data
    batch_size=50,  # sequences per micro-step per process
    gradient_accumulation_steps=16,  # micro-steps per optimizer step, over all processes
    # AdamW
    learning_rate=9e-4,  # peak learning rate
    max_iters=9000,  # optimizer steps in all
    weight_decay=0.1,
    beta1=0.9,
    beta2=0.95,
    grad_clip=0.0,  # clip the gradient norm at this value; 0 = off, as in the write-ups
    # learning rate: linear warmup, then cosine decay to min_lr at lr_decay_iters
    decay_lr=True,
    warmup_iters=300,
    lr_decay_iters=700_000,  # far beyond max_iters, as in the write-ups: the rate stays near peak
    min_lr=9e-5,
    # system
    device="cuda" if torch.cuda.is_available() else "cpu",  # 'cpu', 'cuda', 'cuda:1', ..., 'mps'
    dtype="auto",  # 'float32', 'bfloat16', 'float16'; auto: bf16 (or fp16) on CUDA, fp32 on CPU
    compile=True,  # torch.compile the model; on a CPU or MPS only when asked (slow to compile)
    backend="nccl",  # process-group backend on CUDA; CPU runs always use gloo
    seed=1337,
)
EVAL_SEED_OFFSET = 1_000_000  # eval batches use seed + this, a seed no rank trains with


def get_config(argv, script_keys=(), check_model=False):
    """The checked config of `[config_file.py ...] [--key=value ...]` (lib/settings.py)."""
    return settings.get_config(DEFAULTS, argv, script_keys, check_model)


# --------------------------------------------------------------------------------------
# the data, the learning rate, the loss estimate


def get_batch(data_dir, split, generator, batch_size, block_size, device):
    """batch_size random windows of split.bin: x (B, T) and y, x shifted by one token."""
    # a fresh memmap per batch: a long-lived np.memmap leaks memory
    tokens = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
    starts = torch.randint(len(tokens) - block_size, (batch_size, 1), generator=generator).numpy()
    windows = torch.from_numpy(tokens[starts + np.arange(block_size + 1)].astype(np.int64))
    x, y = windows[:, :-1].contiguous(), windows[:, 1:].contiguous()  # (B, T) each
    if device.startswith("cuda"):
        # pinned memory lets the copy run while the GPU works
        x, y = x.pin_memory(), y.pin_memory()
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    return x.to(device), y.to(device)  # no pinned memory on MPS; on a CPU, the same tensors


def get_lr(it, config):
    """Linear warmup for warmup_iters, then cosine decay to min_lr at lr_decay_iters (nanoGPT)."""
    lr, min_lr = config["learning_rate"], config["min_lr"]
    if not config["decay_lr"]:
        return lr
    if it < config["warmup_iters"]:
        return lr * (it + 1) / (config["warmup_iters"] + 1)
    if it > config["lr_decay_iters"]:
        return min_lr
    ratio = (it - config["warmup_iters"]) / (config["lr_decay_iters"] - config["warmup_iters"])
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


@torch.no_grad()
def estimate_loss(model, config, device, autocast):
    """Mean eval-mode loss (plain cross-entropy) over eval_iters batches of each split."""
    # the same batches each time, from a generator of their own: estimates differ by the model
    # only, and evaluating never moves the training batches
    generator = torch.Generator().manual_seed(config["seed"] + EVAL_SEED_OFFSET)
    model.eval()
    means = []
    for split in ("train", "val"):
        total = 0  # on the device: no sync per batch
        for _ in range(config["eval_iters"]):
            X, Y = get_batch(config["data_dir"], split, generator, config["batch_size"],
                             config["block_size"], device)
            with autocast:
                loss = model(X, Y)[1]  # the logits go at once, not kept through the next one
            total = total + loss.float()
        means.append(total / config["eval_iters"])
    model.train()
    train_loss, val_loss = torch.stack(means).tolist()  # one read from the device
    return dict(train_loss=train_loss, val_loss=val_loss)


# --------------------------------------------------------------------------------------
# one optimizer step's gradients


def forward_backward(model, batches, accum_steps, autocast, scaler, ddp, optimizer, grad_clip):
    """One step's gradients over accum_steps micro-batches, unscaled (fp16), clipped at grad_clip
    if > 0. Returns the means over micro-steps and processes of loss (what the gradients come
    from: the cross-entropy plus the weighted aux losses), cross_entropy, grad_norm and aux."""
    X, Y = next(batches)
    means = {}  # loss, cross_entropy and each aux loss over the micro-steps, on the device
    for micro_step in range(accum_steps):
        last = micro_step == accum_steps - 1
        # DDP averages the gradients over the processes in the last backward only
        with model.no_sync() if ddp and not last else nullcontext():
            with autocast:
                logits, loss, aux = model(X, Y)
            with torch.no_grad():  # the cross-entropy alone, as the evaluations measure it
                cross_entropy = F.cross_entropy(logits.flatten(0, 1).float(), Y.flatten())
            del logits  # not kept alive through the next forward
            if not last:
                X, Y = next(batches)  # fetch while the GPU computes
            # divided, the summed gradients are those of the mean loss
            scaler.scale(loss / accum_steps).backward()
        for name, value in dict(loss=loss, cross_entropy=cross_entropy, **aux).items():
            means[name] = means.get(name, 0) + value.detach().float() / accum_steps
    scaler.unscale_(optimizer)  # the true gradients, not fp16's scaled ones
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if grad_clip > 0:
        means["grad_norm"] = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    else:
        means["grad_norm"] = torch.nn.utils.get_total_norm([p.grad for p in params])
    flat = torch.cat([value.float().view(-1) for value in means.values()])
    if ddp:  # every rank then sees the same numbers
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
    parts = flat.cpu().split([value.numel() for value in means.values()])  # one read per step
    numbers = {name: part.tolist() if value.dim() else part.item()  # a list: the per-layer loss
               for (name, value), part in zip(means.items(), parts)}
    numbers["aux"] = {name: numbers.pop(name) for name in aux}
    return numbers


# --------------------------------------------------------------------------------------
# the run


def eval_due(iter_num, last_eval_iter, config):
    """An evaluation is due every eval_interval steps and at the end, once."""
    at_eval = iter_num % config["eval_interval"] == 0 or iter_num == config["max_iters"]
    return at_eval and last_eval_iter != iter_num


def upcoming(iter_num, last_eval_iter, config):
    """What the run does next, as a stop signal is told: the evaluation due, or the next step."""
    if eval_due(iter_num, last_eval_iter, config):
        return f"the evaluation at iteration {iter_num}"
    return f"iteration {iter_num + 1}"


def build(config, model_args, device, rank, world_size, saved):
    """The model (raw; compiled, in DDP), AdamW, the fp16 scaler and the batches' generator, as
    ckpt.pt saved them when resuming."""
    torch.manual_seed(config["seed"] + rank)  # each rank its own dropout and batches
    batch_generator = torch.Generator().manual_seed(config["seed"] + rank)
    torch.backends.cuda.matmul.allow_tf32 = True  # TF32 matmuls on a GPU
    torch.backends.cudnn.allow_tf32 = True
    device_type = torch.device(device).type  # AdamW is fused on CUDA only
    raw_model = settings.build_model(config["model_type"], model_args).to(device)
    optimizer = raw_model.configure_optimizers(config["weight_decay"], config["learning_rate"],
                                               (config["beta1"], config["beta2"]), device_type)
    scaler = torch.amp.GradScaler(device_type, enabled=config["dtype"] == "float16")
    if saved:
        checkpoint.restore(saved, raw_model, optimizer, scaler, batch_generator, rank)
    model = torch.compile(raw_model) if config["compile"] else raw_model
    if world_size > 1:
        # an encdec model without embedding loss keeps a LayerNorm that gets no gradient
        unused = config["model_type"] == "encdec" and model_args["embedding_loss_type"] == "none"
        model = DDP(model, device_ids=[torch.device(device)] if device_type == "cuda" else None,
                    find_unused_parameters=unused)
    return raw_model, model, optimizer, scaler, batch_generator  # DDP copies rank 0's weights


def train(config, as_script=False):
    """Trains as config says, in each process under torchrun; returns model, iter_num and
    best_val_loss. A stop signal ends it after the step, its state saved (cli.Stopped)."""
    under_way = "the evaluation at iteration 0"  # what a stop waits for, as a signal is told
    with guards.launched(config, lambda: f"stopping after {under_way} with its state saved",
                         as_script) as launch:
        rank, world_size, device, data_identity, data_stamps, stop = launch
        master, ddp = rank == 0, world_size > 1  # rank 0 logs and saves
        dtype, autocast = machine.autocast_for(config["dtype"], torch.device(device).type)
        config = dict(config, dtype=dtype)  # logged and saved as resolved
        model_args, max_iters = settings.model_args_of(config), config["max_iters"]
        ckpt_path, best_path, log_path = (os.path.join(config["out_dir"], name)
                                          for name in ("ckpt.pt", "best.pt", "log.jsonl"))

        saved = None  # a resumed run's ckpt.pt, checked against the config and the data
        if config["init_from"] == "resume":
            saved = checkpoint.load_resumable(ckpt_path, config)
        if config["eval_only"]:
            return evaluate_only(config, saved, device, autocast) if master else None
        with guards.rank0_decides(ddp):
            if saved and master:
                checkpoint.check_resumed_data(saved, config, data_identity)
        if saved and checkpoint.nothing_to_train(saved, config):
            return dict(model=checkpoint.model_from_checkpoint(saved).to(device),
                        iter_num=saved["iter_num"], best_val_loss=saved["best_val_loss"])

        raw_model, model, optimizer, scaler, batch_generator = build(config, model_args, device,
                                                                     rank, world_size, saved)
        batches = (get_batch(config["data_dir"], "train", batch_generator, config["batch_size"],
                             config["block_size"], device) for _ in itertools.count())
        eval_model = model.module if ddp else model  # rank 0 evaluates alone, outside DDP

        # the run's state: what the loop reads and changes, a resumed run's from ckpt.pt
        resumed = saved or {}
        iter_num, last_eval_iter = resumed.get("iter_num", 0), resumed.get("last_eval_iter")
        best_val_loss = resumed.get("best_val_loss", math.inf)
        first_val_loss = resumed.get("first_val_loss")  # the first evaluation's val loss
        last_good = iter_num if saved else None  # the iteration ckpt.pt holds
        diverging = False  # the last evaluation was too far above the best to be saved
        accum_steps = config["gradient_accumulation_steps"] // world_size  # per process
        wandb = peak_flops = None
        if master:
            wandb = log.start(log_path, config, model_args, raw_model, world_size, iter_num,
                              data_identity)
            flops_per_step = raw_model.flops_per_token() * log.tokens_per_iter(config)
            peak_flops = machine.speed_notes(device, flops_per_step)

        def checked_state(rng):  # (best.pt's, ckpt.pt's) state; the run stops if not finite
            state, full = checkpoint.states(
                config, raw_model, optimizer, scaler, rng, iter_num=iter_num,
                best_val_loss=best_val_loss, last_eval_iter=last_eval_iter,
                first_val_loss=first_val_loss, data=data_identity)
            guards.check_state(full, config, last_good)
            return state, full

        def stop_if_requested():  # a signal to any process: all stop after the same step
            nonlocal under_way, last_good
            # set before looking: a signal that comes later waits for what it says
            under_way = upcoming(iter_num, last_eval_iter, config)
            if signum := guards.stop_requested(stop, ddp, device):
                rng = checkpoint.rng_states(batch_generator, world_size)
                if master and not diverging and last_eval_iter != iter_num:  # else saved
                    checkpoint.save_checkpoint(ckpt_path, checked_state(rng)[1])
                    last_good = iter_num
                raise guards.stopped(signum, iter_num, config, last_good, master)

        under_way = upcoming(iter_num, last_eval_iter, config)
        while True:
            if eval_due(iter_num, last_eval_iter, config):
                rng = checkpoint.rng_states(batch_generator, world_size)
                last_eval_iter = iter_num
                with guards.rank0_decides(ddp):  # what stops rank 0 here stops every process
                    if master:
                        guards.check_data_unchanged(config, data_stamps)
                        losses = estimate_loss(eval_model, config, device, autocast)
                        improved = log.evaluation(log_path, iter_num, losses, best_val_loss, wandb)
                        val_loss = losses["val_loss"]
                        best_val_loss = val_loss if improved else best_val_loss
                        diverging = guards.check_evaluation(iter_num, losses, best_val_loss,
                                                            first_val_loss, config, last_good)
                        first_val_loss = val_loss if first_val_loss is None else first_val_loss
                        state, full = checked_state(rng)
                        if improved:  # first: ckpt.pt never claims a newer best.pt
                            checkpoint.save_checkpoint(best_path, state)
                        if not diverging:  # else ckpt.pt keeps the last good state
                            checkpoint.save_checkpoint(ckpt_path, full)
                            last_good = iter_num
                if iter_num < max_iters:
                    stop_if_requested()
            if iter_num >= max_iters:
                break
            t0 = time.time()
            lr = get_lr(iter_num, config)
            for group in optimizer.param_groups:
                group["lr"] = lr
            step = forward_backward(model, batches, accum_steps, autocast, scaler, ddp, optimizer,
                                    config["grad_clip"])
            guards.check_step(iter_num + 1, step, config, last_good)
            scaler.step(optimizer)  # fp16: skipped when a gradient is not finite
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            iter_num += 1
            if master and iter_num % config["log_interval"] == 0:
                dt = time.time() - t0  # this step's seconds, as nanoGPT times them
                sequences = config["batch_size"] * accum_steps  # this process's
                mfu = peak_flops and raw_model.estimate_mfu(sequences, dt, peak_flops)
                log.step(log_path, iter_num, step, lr, dt, config, mfu, wandb)
            stop_if_requested()

        if wandb:
            wandb.finish()  # the process ends without the teardown that would
        return dict(model=raw_model, iter_num=iter_num, best_val_loss=best_val_loss)


def evaluate_only(config, saved, device, autocast):
    """--eval_only: the saved model's losses, logged apart from the run's own evaluations."""
    model, iter_num = checkpoint.model_from_checkpoint(saved).to(device), saved["iter_num"]
    losses = estimate_loss(model, config, device, autocast)
    log.write(os.path.join(config["out_dir"], "log.jsonl"),
              dict(type="eval_only", iter=iter_num, **losses, data_dir=config["data_dir"],
                   eval_iters=config["eval_iters"]))
    return dict(model=model, iter_num=iter_num, best_val_loss=None)


@cli.main
def main(argv):
    if configurator.wants_help(argv):  # with the values the rest of argv gives
        print(configurator.usage(__doc__, get_config(argv)))
        return 0
    train(get_config(argv, check_model=True), as_script=__name__ == "__main__")
    return 0


if __name__ == "__main__":
    cli.exit_now(main())  # without torch's slow teardown
