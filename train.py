"""
Trains one of the three models (baseline, future attention, auto-regressive encoder-decoder)
on the token files that prepare_wikipedia.py writes. The defaults are the write-ups' training
settings (settings.py) and, for the model, the defaults of its GPTConfig (each write-up's
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
(docs/training.md, "What is checked, and when").
"""

import functools
import math
import os
import random
import shlex
import signal
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import configurator
from lib import checkpoint, cli, data, machine, settings
from lib.cli import ConfigError, UserError

EVAL_SEED_OFFSET = 1_000_000  # eval batches use seed + this, a seed no rank trains with

# --------------------------------------------------------------------------------------
# learning rate, loss estimates


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


def check_finite(iteration, loss, aux, grad_norm, fp16):
    """What is not finite in a step's losses and gradient norm, said in a sentence, or None; checked
    before the optimizer steps. A non-finite gradient under fp16 is the gradient scaler's business
    (it skips that step and lowers its scale), so it is not named there."""
    values = [("loss", loss), *flat_aux(aux), *([] if fp16 else [("gradient norm", grad_norm)])]
    bad = [name for name, value in values if not math.isfinite(value)]
    if bad:
        return f"iteration {iteration}: non-finite {', '.join(bad)} ({', '.join(f'{n} {v}' for n, v in values)})"
    return None


def diverged(what, last_good, config, world_size):
    """The UserError that stops a run that diverged: what was not finite, where the last good state
    is (last_good: (path, iteration) or None), and the command that goes on with half the learning
    rate."""
    lower = {"learning_rate": f"{config['learning_rate'] / 2:g}"}
    if config["decay_lr"] and config["min_lr"] > config["learning_rate"] / 2:
        lower["min_lr"] = f"{config['min_lr'] / 2:g}"  # min_lr may not exceed learning_rate
    if last_good:
        path, iteration = last_good
        where = f"{path} (iteration {iteration}) holds the last good state; resume it with half the learning rate: "
        command = rerun_command(world_size, init_from="resume", **lower)
    else:
        where = "no state was saved; start again with half the learning rate: "
        command = rerun_command(world_size, overwrite="True", **lower)
    return UserError(f"{what}: stopped, nothing non-finite was saved; {where}{command}")


def nonfinite_evaluation(iter_num, losses, model, optimizer):
    """What is not finite at an evaluation, its losses or the state about to be saved, said in a
    sentence, or None."""
    if not all(math.isfinite(loss) for loss in losses.values()):
        return (f"non-finite losses at the evaluation of iteration {iter_num} (train {losses['train']}, "
                f"val {losses['val']})")
    bad = checkpoint.nonfinite_tensors(dict(model=model.state_dict(), optimizer=optimizer.state_dict()))
    return f"iteration {iter_num}: non-finite values in {bad[0]}" if bad else None


def warn_if_diverging(iter_num, val_loss, first_val_loss):
    """A finite divergence: a val loss above the run's first evaluation's (the untrained model's)
    gets a warning. Returns the run's first val loss (this one, at the first evaluation)."""
    if first_val_loss is None:
        return val_loss
    if val_loss > first_val_loss:
        print(f"warning: val loss {val_loss:.4f} at iteration {iter_num} is above the run's first evaluation's, "
              f"{first_val_loss:.4f}: the run is diverging — try a lower --learning_rate", file=sys.stderr)
    return first_val_loss


def data_changed(data_dir, ckpt_path):
    """The UserError of a run whose data files were rewritten while it trained."""
    return UserError(f"the data in {data_dir} changed during the run (train.bin, val.bin or meta.json were "
                     f"rewritten): stopped without saving; {ckpt_path} keeps the state trained on the data this "
                     f"run started with — resume it on that data, or with --new_data=True")


# --------------------------------------------------------------------------------------
# the run


def run(config, rank, world_size, device, autocast, stop, saved=None, data_identity=None, data_stamps=None):
    """Trains the model config describes, in one process of world_size, from scratch or from
    saved (the ckpt.pt train() read), until max_iters or a signal (stop.signum); returns the
    trained (unwrapped) model, iter_num and best_val_loss. Rank 0 records data_identity in the
    log and the checkpoints, and stops when data.stamps() differ from data_stamps at an evaluation."""
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    # every rank seeds differently (dropout, batches); DDP copies rank 0's initial weights
    batch_generator = seed_all(config["seed"] + rank)
    model_args = settings.model_args_of(config)
    raw_model = settings.build_model(config["model_type"], model_args).to(device)
    optimizer = raw_model.configure_optimizers(
        config["weight_decay"], config["learning_rate"], (config["beta1"], config["beta2"]), device_type
    )
    scaler = torch.amp.GradScaler(device_type, enabled=config["dtype"] == "float16")  # fp16 only
    iter_num, best_val_loss, last_eval_iter = 0, float("inf"), None
    first_val_loss, last_good = None, None  # the run's first val loss; (ckpt.pt, its iteration) once saved
    if saved:  # the weights, AdamW's state and this rank's random states, as the run left them
        first_val_loss = saved.get("first_val_loss")
        iter_num, best_val_loss, last_eval_iter = checkpoint.restore(saved, raw_model, optimizer, scaler,
                                                                     batch_generator, rank)

    master, ddp = rank == 0, world_size > 1  # rank 0 logs and saves
    next_check = iter_num + 1  # the step after which the loop next looks for a signal
    if master:  # the first signal is answered at once; the stop comes after the step under way
        stop.acknowledge = lambda signum: stopping_note(signum, f"iteration {min(next_check, config['max_iters'])}")
    accum_steps = config["gradient_accumulation_steps"] // world_size  # micro-steps per process
    model = torch.compile(raw_model) if config["compile"] else raw_model
    eval_model = model  # evaluation runs on rank 0 alone, outside DDP
    if ddp:
        model = wrap_ddp(model, config, model_args, device)
    batch = batches(config, device)
    ckpt_path = os.path.join(config["out_dir"], "ckpt.pt")
    if saved:
        last_good = (ckpt_path, iter_num)
    logger = Logger(os.path.join(config["out_dir"], "log.jsonl"), config, model_args, raw_model, world_size,
                    iter_num, data_identity) if master else None
    if master and device_type == "cpu":  # before compiling and the first evaluation, both slow there
        machine.warn_if_slow_on_cpu(config, raw_model.flops_per_token(),
                                     tokens_per_step=accum_steps * config["batch_size"] * config["block_size"])

    def save(rng):  # ckpt.pt: the latest state (rank 0 only)
        checkpoint.save_checkpoint(ckpt_path, checkpoint.training_state(
            config, model_args, raw_model, optimizer, scaler, iter_num, best_val_loss, rng, last_eval_iter,
            data_identity, first_val_loss))

    def evaluate(rng):  # estimate the losses, log them, save what is finite; the problem that stops the run, or None
        nonlocal best_val_loss, first_val_loss
        if data_stamps is not None and data.stamps(config["data_dir"]) != data_stamps:
            return data_changed(config["data_dir"], ckpt_path)
        losses = estimate_loss(eval_model, batch, config["eval_iters"], autocast, config["seed"])
        finite = all(math.isfinite(loss) for loss in losses.values())
        improved = finite and losses["val"] < best_val_loss
        best_val_loss = min(best_val_loss, losses["val"]) if finite else best_val_loss
        # the record first: a kill before the save then resumes from the previous
        # checkpoint, and the resumed launch's records replace this one (report.read_log)
        logger.log(dict(type="eval", iter=iter_num, train_loss=losses["train"], val_loss=losses["val"],
                        best_val_loss=best_val_loss, best=improved))
        problem = nonfinite_evaluation(iter_num, losses, raw_model, optimizer)
        if problem:
            return diverged(problem, last_good, config, world_size)
        first_val_loss = warn_if_diverging(iter_num, losses["val"], first_val_loss)
        if improved:  # best.pt before ckpt.pt: the latest state never claims a newer best.pt
            checkpoint.save_checkpoint(os.path.join(config["out_dir"], "best.pt"), checkpoint.model_state(
                config, model_args, raw_model, iter_num, best_val_loss, data_identity))
        save(rng)
        return None

    t_last, timed_iters = time.time(), 0
    while True:
        # estimate the losses, then save: every eval_interval steps and at the end
        at_eval = iter_num % config["eval_interval"] == 0 or iter_num == config["max_iters"]
        if at_eval and last_eval_iter != iter_num:
            rng = gather_rng_states(batch_generator, world_size)  # every rank's, for the checkpoint
            last_eval_iter = iter_num
            agree(evaluate(rng) if master else None, ddp)  # every process stops when rank 0's evaluation says so
            last_good = (ckpt_path, iter_num)  # saved, and finite
            t_last, timed_iters = time.time(), 0  # timings leave out evaluation
        if iter_num >= config["max_iters"]:
            break

        lr = get_lr(iter_num, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss, aux, grad_norm = forward_backward(model, functools.partial(batch, generator=batch_generator),
                                                accum_steps, autocast, scaler, ddp, optimizer, config["grad_clip"])
        problem = check_finite(iter_num + 1, loss, aux, grad_norm, fp16=scaler.is_enabled())
        if problem:  # every process sees the same numbers, so all stop here, before the step reaches the weights
            raise diverged(problem, last_good, config, world_size)
        scaler.step(optimizer)  # under fp16, skipped when a gradient is not finite
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        timed_iters += 1

        if master and iter_num % config["log_interval"] == 0:
            dt = (time.time() - t_last) / timed_iters  # mean seconds per step since the last record
            t_last, timed_iters = time.time(), 0
            logger.log_step(iter_num, loss, aux, lr, dt, sequences=config["batch_size"] * accum_steps)

        # a signal from here on stops after the next step: the acknowledgement says which
        requested, next_check = stop.signum, iter_num + 1
        signum = agreed_stop(requested, ddp, device)  # every process stops after the same step
        if signum:
            rng = gather_rng_states(batch_generator, world_size)
            if master:
                save(rng)
            raise cli.Stopped(signum, stopped_note(signum, iter_num, ckpt_path, world_size) if master else "")

    return dict(model=raw_model, iter_num=iter_num, best_val_loss=best_val_loss)


def batches(config, device):
    """batch(split, generator): a batch of the data's training or validation tokens, on the device."""
    return functools.partial(data.get_batch, config["data_dir"], batch_size=config["batch_size"],
                             block_size=config["block_size"], device=device)


def evaluate_only(config, saved, device, autocast):
    """--eval_only: the losses of the saved model, printed and logged as an "eval_only" record,
    which report.py and study.py keep apart from the run's own evaluations."""
    model, iter_num = checkpoint.model_from_checkpoint(saved).to(device), saved["iter_num"]
    losses = estimate_loss(model, batches(config, device), config["eval_iters"], autocast, config["seed"])
    record = dict(type="eval_only", iter=iter_num, train_loss=losses["train"], val_loss=losses["val"],
                  data_dir=config["data_dir"], eval_iters=config["eval_iters"])
    print(f"evaluation only, of {config['out_dir']}/ckpt.pt at iteration {iter_num} on {config['data_dir']} "
          f"({config['eval_iters']} batches per split): train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    checkpoint.append_record(os.path.join(config["out_dir"], "log.jsonl"), record)
    return dict(model=model, iter_num=iter_num, best_val_loss=None)


def nothing_to_train(config, saved, master):
    """Whether the saved run is done: at max_iters, with its evaluation there made. Rank 0 says
    which it is: done, or resumed and training on."""
    iter_num, ckpt_path = saved["iter_num"], os.path.join(config["out_dir"], "ckpt.pt")
    finished = iter_num >= config["max_iters"] and saved["last_eval_iter"] == iter_num
    if master:
        print(f"{ckpt_path} is at iteration {iter_num} and max_iters is {config['max_iters']}: nothing to train "
              f"(raise --max_iters to train on)" if finished else
              f"resumed from iteration {iter_num} ({ckpt_path}), training to max_iters {config['max_iters']}")
    return finished


def stopped_note(signum, iter_num, ckpt_path, world_size):
    """What the user reads after a signal stopped the run: where, and the command that continues it."""
    return (f"stopped by {signal.Signals(signum).name} after iteration {iter_num}: saved {ckpt_path}; "
            f"continue with: {rerun_command(world_size, init_from='resume')}")


def rerun_command(world_size, **changes):
    """This launch's command line, with --key=value for each of changes instead of the launch's own."""
    dropped = ("--init_from=", "--overwrite=", *(f"--{key}=" for key in changes))
    args = [arg for arg in configurator.normalize(sys.argv[1:]) if not arg.startswith(dropped)]
    launcher = ["python", "train.py"] if world_size == 1 else ["torchrun", "--standalone", f"--nproc_per_node={world_size}", "train.py"]
    return " ".join(shlex.quote(arg) for arg in [*launcher, *args, *(f"--{key}={value}" for key, value in changes.items())])


def stopping_note(signum, when):
    """The line a first signal gets at once: the run stops after `when`, a step that may take minutes."""
    return f"{signal.Signals(signum).name}: stopping after {when} with its state saved; {cli.again(signum)}"


def agreed_stop(signum, ddp, device):
    """The signal that any process was sent (each process's signum, or None), on every process."""
    if not ddp:
        return signum
    flag = torch.tensor([signum or 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() or None


class Logger:
    """Rank 0's records: printed, appended to log.jsonl, and sent to Weights & Biases if asked."""

    def __init__(self, log_path, config, model_args, model, world_size, iter_num, data_identity):
        tokens_per_iter = config["gradient_accumulation_steps"] * config["batch_size"] * config["block_size"]
        self.path, self.model, self.tokens_per_iter = log_path, model, tokens_per_iter
        self.wandb = None
        if config["wandb_log"]:  # first: wandb may fail, and then nothing is logged yet
            import wandb  # check_before_writing made sure it is installed
            wandb.init(project=config["wandb_project"], name=config["wandb_run_name"], config=config)
            self.wandb = wandb
        checkpoint.end_line(log_path)
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
                            **{f"train/{name}": value for name, value in flat_aux(aux)}})


def flat_aux(aux):
    """(name, value) for every auxiliary loss, a per-layer list giving name/1, name/2, ..."""
    for name, value in aux.items():
        if isinstance(value, list):
            yield from ((f"{name}/{layer}", v) for layer, v in enumerate(value, 1))
        else:
            yield name, value


# --------------------------------------------------------------------------------------
# processes: one, or one per GPU under torchrun


def seed_all(seed):
    """Seeds every random generator training reads; returns the batch sampler's own generator."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def wrap_ddp(model, config, model_args, device):
    """The model in DistributedDataParallel, which averages the gradients over the processes."""
    # an encdec model without embedding loss still owns the unused LayerNorm on E (the
    # write-up's parameter counts include it); DDP must be told that it gets no gradient
    unused = config["model_type"] == "encdec" and model_args["embedding_loss_type"] == "none"
    return DDP(model, device_ids=[torch.device(device)] if device.startswith("cuda") else None,
               find_unused_parameters=unused)


def setup_distributed(config):
    """(rank, world_size, device); under torchrun (RANK set) joins the process group."""
    if "RANK" not in os.environ:
        return 0, 1, config["device"]
    rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    if config["device"].startswith("cuda"):
        device, backend = f"cuda:{local_rank}", config["backend"]
        torch.cuda.set_device(device)
    else:
        device, backend = "cpu", "gloo"  # nccl needs GPUs
    dist.init_process_group(backend=backend)
    return rank, world_size, device


def with_precision(config, device):
    """(config with its dtype resolved, the autocast context); TF32 matmuls on CUDA."""
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    dtype, autocast = settings.autocast_for(config["dtype"], device_type)
    torch.backends.cuda.matmul.allow_tf32 = True  # no effect on a CPU
    torch.backends.cudnn.allow_tf32 = True
    return dict(config, dtype=dtype), autocast  # the config is logged and saved as resolved


def gather_rng_states(batch_generator, world_size):
    """Every rank's random states (checkpoint.get_rng_state), on every rank."""
    states = [None] * world_size
    if world_size > 1:
        dist.all_gather_object(states, checkpoint.get_rng_state(batch_generator))
    else:
        states[0] = checkpoint.get_rng_state(batch_generator)
    return states


def agree(problem, ddp):
    """Under DDP, rank 0's problem (an exception or None) becomes every rank's, so all stop together."""
    if ddp:
        shared = [problem]
        dist.broadcast_object_list(shared, src=0)
        problem = shared[0]
    if problem:
        raise problem


def check_before_writing(config, world_size):
    """Everything that can fail before training starts fails here, before anything is written
    to out_dir: settings, the data, wandb (the device was checked with the settings). Returns the
    data's identity (data.check_data) and its stamps, taken before it was hashed."""
    if config["gradient_accumulation_steps"] % world_size:
        raise ConfigError(f"gradient_accumulation_steps ({config['gradient_accumulation_steps']}) is the total over "
                          f"all processes and must be divisible by the world size ({world_size})")
    if config["eval_only"] and config["init_from"] != "resume":
        raise ConfigError("eval_only=True evaluates a trained run's ckpt.pt: add --init_from=resume")
    settings.model_args_of(config)  # the model's own checks (GPTConfig)
    stamps = data.stamps(config["data_dir"])  # first: a change while the files are hashed shows at the first evaluation
    identity = data.check_data(config["data_dir"], config["block_size"], config["vocab_size"])
    if config["wandb_log"]:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ConfigError("wandb_log=True needs wandb: `pip install wandb`, or drop --wandb_log") from None
    return identity, stamps


def train(config):
    """Run the training job that config describes; returns the trained (unwrapped) model,
    iter_num and best_val_loss. Under torchrun, every process calls this. A stop signal
    (cli.STOP_SIGNALS) stops it after the current optimizer step, with the state saved
    (cli.Stopped). A run that fails before its first record leaves nothing in out_dir."""
    rank, world_size, device = setup_distributed(config)
    lock = data_lock = identity = stamps = None
    try:
        problem = None
        if rank == 0:  # rank 0 writes the out_dir, so it holds the lock; and the data folder's, shared
            try:
                data_lock = data.hold_for_reading(config["data_dir"])  # before the data is checked and hashed
                identity, stamps = check_before_writing(config, world_size)
                lock = checkpoint.claim_out_dir(config)
            except UserError as e:
                problem = e
        agree(problem, ddp=world_size > 1)
        acknowledge = (lambda signum: stopping_note(signum, "the first step")) if rank == 0 else None
        # run as a script, a second signal ends the process within seconds, whatever hangs in its teardown
        exit_within_s = 10.0 if __name__ == "__main__" else None
        with cli.StopRequests(acknowledge, passed_on=world_size > 1, exit_within_s=exit_within_s) as stop:
            config, autocast = with_precision(config, device)
            saved = None
            if config["init_from"] == "resume":  # every rank reads the checkpoint it continues from
                saved = checkpoint.load_resumable(os.path.join(config["out_dir"], "ckpt.pt"), config,
                                                  settings.model_args_of(config))
                if config["eval_only"]:
                    return evaluate_only(config, saved, device, autocast) if rank == 0 else None
                problem = None
                if rank == 0:
                    try:
                        check_resumed(saved, config, identity)
                    except UserError as e:
                        problem = e
                agree(problem, ddp=world_size > 1)
                if nothing_to_train(config, saved, master=rank == 0):
                    return dict(model=checkpoint.model_from_checkpoint(saved).to(device), iter_num=saved["iter_num"],
                                best_val_loss=saved["best_val_loss"])
            return run(config, rank, world_size, device, autocast, stop, saved, identity, stamps)
    except BaseException:
        if lock:  # removes the lock file and out_dir if the lock made them and nothing was written since
            lock.undo()
            lock = None
        raise
    finally:
        if lock:
            lock.close()
        if data_lock:
            data_lock.close()
        if "RANK" in os.environ:  # setup_distributed joined a process group
            dist.destroy_process_group()


def check_resumed(saved, config, identity):
    """Before a resumed run trains (rank 0): it must train on the checkpoint's data, unless
    --new_data=True; and every setting that differs from the checkpoint's is printed."""
    checkpoint.check_data_identity(saved, identity, config["new_data"], config["out_dir"])
    changed = checkpoint.changed_settings(saved, config)
    if changed:
        print(f"resumed with settings that differ from the checkpoint's: {changed}")


@cli.main
def main(argv):
    """Command-line entry: returns the exit status (2 for a bad setting, 1 for other errors)."""
    if configurator.wants_help(argv):
        print(settings.usage(__doc__, argv))
        return 0
    train(settings.get_config(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
