"""
Trains one of the three models (baseline, future attention, auto-regressive encoder-decoder)
on the token files that prepare_wikipedia.py writes. The defaults are the write-ups' training
settings (lib/settings.py) and, for the model, the defaults of its GPTConfig (each write-up's
shape); a config file and --key=value flags change any setting.

    python train.py config/future50_mse.py                     # one GPU: compile + bf16
    python train.py config/tiny_cpu.py                         # a CPU, a few minutes
    python train.py config/baseline.py --batch_size=25 --gradient_accumulation_steps=32
    python train.py config/future50_mse.py --init_from=resume  # continue from out_dir/ckpt.pt
    python train.py config/tiny_cpu.py --help                   # every key with its value
    torchrun --standalone --nproc_per_node=8 train.py config/future50_mse.py   # 8 GPUs, one node

gradient_accumulation_steps is the TOTAL number of micro-steps per optimizer step over all
processes, so a config gives the same tokens per step on 1 or 8 GPUs. Rank 0 prints, appends
JSON lines to out_dir/log.jsonl ("start", "train", "eval" records), and at every evaluation
writes the whole state to out_dir/ckpt.pt and, when val improved, the model to best.pt.
Ctrl-C, SIGTERM, SIGHUP or SIGUSR1 stops the run after the current step, with its state
saved; a new run refuses an out_dir that already holds a run (resume it, or pass
--overwrite=True), and a run locks its out_dir (out_dir/train.lock) so that a second one
cannot write there too. A loss or gradient that is not finite stops the run before it reaches
the weights, and nothing non-finite is ever saved; a run records the sha256 of its data and
holds data_dir/data.lock shared while it trains, and a resume on other data is refused
(docs/training.md, "What is checked, and when"). Those guards are lib/guards.py's, one call each.
"""

import functools
import math
import os
import random
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import configurator
from lib import checkpoint, cli, guards, machine, settings

EVAL_SEED_OFFSET = 1_000_000  # eval batches use seed + this, a seed no rank trains with

# --------------------------------------------------------------------------------------
# the data, the learning rate, the loss estimate


def get_batch(data_dir, split, generator, batch_size, block_size, device):
    """batch_size random windows of split.bin: x (B, T) and y, x shifted by one token; int64."""
    # a fresh memmap per batch: a long-lived np.memmap leaks memory (nanoGPT's note)
    data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator).tolist()
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])  # (B, T)
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])  # (B, T)
    if device.startswith("cuda"):
        # pinned memory lets the copy run asynchronously while the GPU works
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
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
def estimate_loss(model, batch, eval_iters, autocast, seed):
    """Mean eval-mode loss (plain cross-entropy) over eval_iters batches of each split."""
    # the same batches at every estimate, from a generator of their own: successive
    # estimates differ by the model only, and evaluating never moves the training batches
    generator = torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET)
    model.eval()
    means = []
    for split in ("train", "val"):
        total = 0  # the sum of the split's losses, on the device: no sync per batch
        for _ in range(eval_iters):
            X, Y = batch(split, generator)
            with autocast:
                loss = model(X, Y)[1]  # the logits go at once, not kept through the next forward
            total = total + loss.float()
        means.append(total / eval_iters)
    model.train()
    train_loss, val_loss = torch.stack(means).tolist()  # one read from the device per estimate
    return {"train": train_loss, "val": val_loss}


# --------------------------------------------------------------------------------------
# one optimizer step's gradients


def forward_backward(model, batch, accum_steps, autocast, scaler, ddp, optimizer, grad_clip):
    """The gradients of one optimizer step, accumulated over accum_steps micro-batches per
    process, unscaled (fp16) and clipped at grad_clip (if > 0); returns (loss, {aux name: value},
    grad_norm): the losses each the mean over the micro-steps (and the processes), a float, or a
    list of floats for a per-layer auxiliary loss; grad_norm the gradients' norm before clipping,
    inf or nan when a gradient is not finite."""
    X, Y = batch("train")
    totals = 0  # sum over micro-steps of [loss, *aux losses], on the device
    for micro_step in range(accum_steps):
        last = micro_step == accum_steps - 1
        # DDP averages the gradients across processes in the last micro-step's backward only
        with model.no_sync() if ddp and not last else nullcontext():
            with autocast:
                loss, aux = model(X, Y)[1:]  # the logits go now: kept, they would live through the next forward
            if not last:
                X, Y = batch("train")  # fetch while the GPU computes
            # dividing by accum_steps makes the summed gradients those of the mean loss
            scaler.scale(loss / accum_steps).backward()
        values = [loss, *aux.values()]
        totals = totals + torch.cat([v.detach().float().view(-1) for v in values])
    # the gradients' norm stays on the device, to be read with the losses in the one sync below
    scaler.unscale_(optimizer)  # the true gradients, not the fp16-scaled ones (a no-op without fp16)
    params = [p for group in optimizer.param_groups for p in group["params"]]  # what AdamW steps
    if grad_clip > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    else:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    means = torch.cat([totals / accum_steps, grad_norm.detach().float().view(1)])
    if ddp:  # the mean over all processes; every rank then sees the same numbers
        dist.all_reduce(means)
        means /= dist.get_world_size()
    *parts, grad_norm = means.cpu().split([*(v.numel() for v in values), 1])  # one sync with the device per step
    loss_value, *aux_values = [part.item() if v.dim() == 0 else part.tolist() for part, v in zip(parts, values)]
    return loss_value, dict(zip(aux.keys(), aux_values)), grad_norm.item()


# --------------------------------------------------------------------------------------
# the run


def train(config):
    """Runs the training job that config describes; returns the trained (unwrapped) model,
    iter_num and best_val_loss. Under torchrun, every process calls this. A stop signal
    (cli.STOP_SIGNALS) stops it after the current optimizer step, with the state saved
    (cli.Stopped). A run that fails before its first record leaves nothing in out_dir."""
    with guards.Launch(config, as_script=__name__ == "__main__") as launch:
        rank, world_size, device = launch.rank, launch.world_size, launch.device
        master, ddp = rank == 0, world_size > 1  # rank 0 logs and saves
        device_type = torch.device(device).type  # 'cpu', 'cuda' or 'mps': autocast's and AdamW's
        dtype, autocast = settings.autocast_for(config["dtype"], device_type)
        config = dict(config, dtype=dtype)  # logged and saved as resolved
        torch.backends.cuda.matmul.allow_tf32 = True  # TF32 matmuls on a GPU; no effect on a CPU
        torch.backends.cudnn.allow_tf32 = True
        batch = functools.partial(get_batch, config["data_dir"], batch_size=config["batch_size"],
                                  block_size=config["block_size"], device=device)
        ckpt_path, best_path = (os.path.join(config["out_dir"], name) for name in ("ckpt.pt", "best.pt"))

        # a resumed run goes on from ckpt.pt: checked against the config and the data
        saved = launch.load_resumable() if config["init_from"] == "resume" else None
        if config["eval_only"]:
            return evaluate_only(config, saved, device, batch, autocast) if master else None
        if saved and saved["iter_num"] >= config["max_iters"] and saved["last_eval_iter"] == saved["iter_num"]:
            if master:
                print(f"{ckpt_path} is at iteration {saved['iter_num']} and max_iters is {config['max_iters']}: "
                      f"nothing to train (raise --max_iters to train on)")
            model = checkpoint.model_from_checkpoint(saved).to(device)
            return dict(model=model, iter_num=saved["iter_num"], best_val_loss=saved["best_val_loss"])
        if saved and master:
            print(f"resumed from iteration {saved['iter_num']} ({ckpt_path}), training to max_iters {config['max_iters']}")

        # the model, AdamW and the fp16 gradient scaler; every rank seeds differently (dropout,
        # batches), and DDP copies rank 0's initial weights to the others
        random.seed(config["seed"] + rank)
        np.random.seed(config["seed"] + rank)
        torch.manual_seed(config["seed"] + rank)
        batch_generator = torch.Generator().manual_seed(config["seed"] + rank)  # the training batches' own
        model_args = settings.model_args_of(config)
        raw_model = settings.build_model(config["model_type"], model_args).to(device)
        optimizer = raw_model.configure_optimizers(config["weight_decay"], config["learning_rate"],
                                                   (config["beta1"], config["beta2"]), device_type)
        scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")  # fp16 only
        iter_num, best_val_loss, last_eval_iter = 0, float("inf"), None
        if saved:  # the weights, AdamW's state and this rank's random states, as the run left them
            iter_num, best_val_loss, last_eval_iter = checkpoint.restore(saved, raw_model, optimizer, scaler,
                                                                         batch_generator, rank)
        accum_steps = config["gradient_accumulation_steps"] // world_size  # micro-steps per process
        model = torch.compile(raw_model) if config["compile"] else raw_model
        eval_model = model  # evaluation runs on rank 0 alone, outside DDP
        if ddp:
            # an encdec model without embedding loss still owns the unused LayerNorm on E (the
            # write-up's parameter counts include it); DDP must be told that it gets no gradient
            unused = config["model_type"] == "encdec" and model_args["embedding_loss_type"] == "none"
            model = DDP(model, device_ids=[torch.device(device)] if device_type == "cuda" else None,
                        find_unused_parameters=unused)
        logger = Logger(config, model_args, raw_model, world_size, iter_num, launch.data_identity) if master else None
        if master and device_type == "cpu":  # before compiling and the first evaluation, both slow there
            machine.warn_if_slow_on_cpu(config, raw_model.flops_per_token(),
                                        tokens_per_step=accum_steps * config["batch_size"] * config["block_size"])

        def save_latest(rng):  # ckpt.pt: everything a resumed run needs (rank 0 writes it)
            if master and not launch.diverging:  # a diverging run's ckpt.pt keeps its last good state
                launch.save(ckpt_path, checkpoint.training_state(
                    config, model_args, raw_model, optimizer, scaler, iter_num, best_val_loss, rng, last_eval_iter,
                    launch.data_identity, launch.first_val_loss))

        t_last, timed_iters = time.time(), 0
        while True:
            # estimate the losses, then save: every eval_interval steps and at the end
            at_eval = iter_num % config["eval_interval"] == 0 or iter_num == config["max_iters"]
            if at_eval and last_eval_iter != iter_num:
                rng = launch.gather_rng_states(batch_generator)  # every rank's, for the checkpoint
                last_eval_iter = iter_num
                with launch.evaluation(iter_num):  # what stops rank 0 here stops every process
                    if master:
                        launch.check_data_unchanged()
                        losses = estimate_loss(eval_model, batch, config["eval_iters"], autocast, config["seed"])
                        improved = all(map(math.isfinite, losses.values())) and losses["val"] < best_val_loss
                        best_val_loss = losses["val"] if improved else best_val_loss
                        # the record first: a kill before the save then resumes from the previous
                        # checkpoint, and the resumed launch's records replace this one (report.read_log)
                        logger.log(dict(type="eval", iter=iter_num, train_loss=losses["train"], val_loss=losses["val"],
                                        best_val_loss=best_val_loss, best=improved))
                        launch.check_evaluation(iter_num, losses, best_val_loss)
                        if improved:  # best.pt before ckpt.pt: the latest state never claims a newer best.pt
                            launch.save(best_path, checkpoint.model_state(config, model_args, raw_model, iter_num,
                                                                          best_val_loss, launch.data_identity))
                        save_latest(rng)
                t_last, timed_iters = time.time(), 0  # timings leave out evaluation
                if iter_num < config["max_iters"]:
                    launch.stop_if_requested(iter_num)  # a signal during the evaluation stops here, saved
            if iter_num >= config["max_iters"]:
                break
            lr = get_lr(iter_num, config)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss, aux, grad_norm = forward_backward(model, functools.partial(batch, generator=batch_generator),
                                                    accum_steps, autocast, scaler, ddp, optimizer, config["grad_clip"])
            launch.check_step(iter_num + 1, loss, aux, grad_norm, fp16=scaler.is_enabled())  # before the weights change
            scaler.step(optimizer)  # under fp16, skipped when a gradient is not finite
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            iter_num += 1
            timed_iters += 1
            if master and iter_num % config["log_interval"] == 0:
                dt = (time.time() - t_last) / timed_iters  # mean seconds per step since the last record
                t_last, timed_iters = time.time(), 0
                logger.log_step(iter_num, loss, aux, lr, dt, sequences=config["batch_size"] * accum_steps)
            # a signal: every process stops after this same step, with the state saved
            launch.stop_if_requested(iter_num, save=lambda: save_latest(launch.gather_rng_states(batch_generator)))

        if logger and logger.wandb:
            logger.wandb.finish()  # the process ends without the interpreter's teardown, which would do it
        return dict(model=raw_model, iter_num=iter_num, best_val_loss=best_val_loss)


def evaluate_only(config, saved, device, batch, autocast):
    """--eval_only: the losses of the saved model, printed and logged as an "eval_only" record,
    which report.py and study.py keep apart from the run's own evaluations."""
    model, iter_num = checkpoint.model_from_checkpoint(saved).to(device), saved["iter_num"]
    losses = estimate_loss(model, batch, config["eval_iters"], autocast, config["seed"])
    record = dict(type="eval_only", iter=iter_num, train_loss=losses["train"], val_loss=losses["val"],
                  data_dir=config["data_dir"], eval_iters=config["eval_iters"])
    print(f"evaluation only, of {config['out_dir']}/ckpt.pt at iteration {iter_num} on {config['data_dir']} "
          f"({config['eval_iters']} batches per split): train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    checkpoint.append_record(os.path.join(config["out_dir"], "log.jsonl"), record)
    return dict(model=model, iter_num=iter_num, best_val_loss=None)


class Logger:
    """Rank 0's records: printed, appended to log.jsonl, and sent to Weights & Biases if asked."""

    def __init__(self, config, model_args, model, world_size, iter_num, data_identity):
        tokens_per_iter = config["gradient_accumulation_steps"] * config["batch_size"] * config["block_size"]
        self.path, self.model, self.tokens_per_iter = os.path.join(config["out_dir"], "log.jsonl"), model, tokens_per_iter
        self.wandb = None
        if config["wandb_log"]:  # first: wandb may fail, and then nothing is logged yet
            import wandb  # the launch's checks made sure it is installed
            wandb.init(project=config["wandb_project"], name=config["wandb_run_name"], config=config)
            self.wandb = wandb
        checkpoint.end_line(self.path)  # after a launch killed mid-record, this launch's records start a line
        self.log(dict(type="start", model_type=config["model_type"], num_params=model.get_num_params(),
                      world_size=world_size, tokens_per_iter=tokens_per_iter, iter_num=iter_num,
                      init_from=config["init_from"], config=config, model_args=model_args, data=data_identity))
        self.flops_promised = machine.peak_flops(config["device"]) if config["device"].startswith("cuda") else None

    def log(self, record):
        checkpoint.log_event(self.path, record)
        if self.wandb and record["type"] == "eval":
            self.wandb.log({"iter": record["iter"], "train/loss": record["train_loss"], "val/loss": record["val_loss"]})

    def log_step(self, iter_num, loss, aux, lr, dt, sequences):
        """The train record of a step; dt is the mean seconds per step since the last one, over
        which this process ran forward and backward on `sequences` sequences per step."""
        mfu = self.flops_promised and self.model.estimate_mfu(sequences, dt, self.flops_promised)
        checkpoint.log_event(self.path, dict(type="train", iter=iter_num, loss=loss, aux=aux, lr=lr, ms_per_iter=dt * 1000,
                                             tokens_per_s=self.tokens_per_iter / dt, mfu=mfu))
        if self.wandb:
            self.wandb.log({"iter": iter_num, "train/step_loss": loss, "lr": lr, "mfu": mfu,
                            **{f"train/{name}": value for name, value in checkpoint.flat_aux(aux)}})


@cli.main
def main(argv):
    """Command-line entry: returns the exit status (2 for a bad setting, 1 for other errors)."""
    if configurator.wants_help(argv):
        print(settings.usage(__doc__, argv))
        return 0
    train(settings.get_config(argv, check_model=True))
    return 0


if __name__ == "__main__":
    cli.exit_now(main())  # without the interpreter's teardown of torch's modules, which takes seconds
