"""
The run's guards: launched() holds what a launch must undo; the others take the run's state
from train.py (last_good: the iteration ckpt.pt holds, None before it is saved) and return a
verdict or raise.
"""

import contextlib
import fcntl
import math
import os
import signal
import socket
import sys

import torch
import torch.distributed as dist

from lib import checkpoint, cli, data, log
from lib.cli import UserError

DIVERGED_NATS = 1.0  # an evaluation this far above the best is no state worth resuming


@contextlib.contextmanager
def launched(config, plan, as_script):
    """Joins the process group; rank 0 locks and checks the data, claims out_dir, and answers a
    first stop signal with plan(). Yields (rank, world_size, device, identity, stamps, stop)."""
    rank, world_size, device = setup_distributed(config)
    ddp, out_lock, identity, stamps = world_size > 1, None, None, None
    with contextlib.ExitStack() as undo:
        if ddp:
            undo.callback(dist.destroy_process_group)
        try:
            with rank0_decides(ddp):
                if rank == 0:
                    undo.enter_context(data.hold_for_reading(config["data_dir"]))
                    stamps = data.stamps(config["data_dir"])  # before hashing, which is slow
                    identity = data.check_data(config["data_dir"], config["block_size"],
                                               config["vocab_size"])
                    out_lock = claim_out_dir(config)
                    undo.callback(out_lock.close)
            stop = undo.enter_context(cli.StopRequests(
                plan if rank == 0 else None, passed_on=ddp,
                exit_within_s=10.0 if as_script else None, closed_pipe=True))
            yield rank, world_size, device, identity, stamps, stop
        except BaseException as error:
            out_of_memory = isinstance(error, torch.OutOfMemoryError) or (
                isinstance(error, RuntimeError) and "can't allocate memory" in str(error))
            if out_lock:  # a failed launch leaves no out_dir it made
                if out_of_memory and not os.path.exists(f"{config['out_dir']}/ckpt.pt"):
                    # a new run's log alone would make a smaller batch need --overwrite
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(f"{config['out_dir']}/log.jsonl")
                out_lock.undo()
            if out_of_memory:
                raise UserError(f"out of memory: {config['batch_size']} sequences of "
                                f"{config['block_size']} tokens do not fit on {device}; lower "
                                "--batch_size or --block_size") from None
            raise


def setup_distributed(config):
    """(rank, world_size, device); under torchrun, in the process group."""
    if "RANK" not in os.environ:
        return 0, 1, config["device"]
    device, backend = "cpu", "gloo"  # nccl needs GPUs
    if config["device"].startswith("cuda"):
        device, backend = f"cuda:{os.environ['LOCAL_RANK']}", config["backend"]
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend)
    return dist.get_rank(), dist.get_world_size(), device


@contextlib.contextmanager
def rank0_decides(ddp):
    """A UserError rank 0 meets within it stops every process."""
    problem = None
    try:
        yield
    except UserError as e:
        problem = e
    if ddp:
        shared = [problem]
        dist.broadcast_object_list(shared, src=0)
        problem = shared[0]
    if problem:
        raise problem


class FolderLock:
    """An flock on folder/name, a file naming the holder, which the kernel releases however the
    process ends. undo() also removes the file and the empty folders it made."""

    def __init__(self, folder, name, program, option):
        self.path = os.path.join(folder, name)
        self.made, parent = [], os.path.abspath(folder)  # what makedirs creates, deepest first
        while not os.path.exists(parent):
            self.made.append(parent)
            parent = os.path.dirname(parent)
        try:
            os.makedirs(folder, exist_ok=True)
            self.made_file = not os.path.exists(self.path)
            self.file = open(self.path, "a+")
        except OSError as e:
            raise UserError(f"cannot create {option} {folder} ({e.strerror}): "
                            f"choose another --{option}") from None
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.seek(0)
            holder = self.file.read().strip() or "another process"
            self.file.close()
            raise UserError(f"{folder} is in use by {holder}: wait for it to end, "
                            f"or choose another --{option}") from None
        self.file.truncate(0)
        self.file.write(f"{program} (process {os.getpid()} on {socket.gethostname()})\n")
        self.file.flush()

    def close(self):
        self.file.close()

    def undo(self):
        if self.made_file:
            os.remove(self.path)
        for folder in self.made:
            with contextlib.suppress(OSError):  # one that holds something stays
                os.rmdir(folder)
        self.close()


def claim_out_dir(config):
    """Make and lock out_dir; a new run replaces a run there only when asked (overwrite)."""
    out_dir, fresh = config["out_dir"], config["init_from"] == "scratch"
    lock = FolderLock(out_dir, "train.lock", "train.py", "out_dir")
    existing = [name for name in ("ckpt.pt", "best.pt", "log.jsonl")
                if os.path.exists(os.path.join(out_dir, name))]
    names = ", ".join(existing)
    if existing and fresh and config["overwrite"]:
        for name in existing:
            os.remove(os.path.join(out_dir, name))
        print(f"overwrite=True: deleted {names} in {out_dir}")
    elif existing and (fresh or "ckpt.pt" not in existing):
        lock.undo()
        if "ckpt.pt" not in existing:  # nothing to resume from
            raise UserError(f"{out_dir} holds a run that stopped before its first checkpoint: "
                            f"start it again with --overwrite=True (deletes {names})")
        raise UserError(f"{out_dir} already holds a run ({names}): continue it with "
                        "--init_from=resume, or replace it with --overwrite=True")
    return lock


def stop_diverged(what, config, last_good):
    """Raises what went non-finite, with the state to resume and a lower learning rate."""
    lr = min(config["learning_rate"] / 2, 9e-4)  # at most the write-ups' rate
    flags = f"--learning_rate={lr:g}"
    if config["decay_lr"] and config["min_lr"] > lr:
        flags += f" --min_lr={lr:g}"  # min_lr may not exceed learning_rate
    if last_good is not None:
        where = f"{config['out_dir']}/ckpt.pt (iteration {last_good}) holds the last good state"
        go_on, flags = "resume it", f"--init_from=resume {flags}"
    else:
        where, go_on, flags = "no state was saved", "start again", f"--overwrite=True {flags}"
    raise UserError(f"{what}: stopped, nothing non-finite was saved; {where}; {go_on} with a "
                    f"lower learning rate: the same command with {flags}")


def check_step(iteration, step, config, last_good):
    """Stops before a non-finite loss or gradient changes the weights (under fp16 the gradient
    scaler skips such a step)."""
    values = [("loss", step["loss"]), *log.flat(step["aux"])]
    if config["dtype"] != "float16":
        values.append(("gradient norm", step["grad_norm"]))
    bad = [name for name, value in values if not math.isfinite(value)]
    if bad:
        numbers = ", ".join(f"{name} {value}" for name, value in values)
        stop_diverged(f"iteration {iteration}: non-finite {', '.join(bad)} ({numbers})", config,
                      last_good)


def check_evaluation(iter_num, losses, best_val_loss, first_val_loss, config, last_good):
    """Stops at non-finite losses; warns of a val loss above the untrained model's. Returns
    whether the run diverges: a state not worth saving over the last good one."""
    val_loss = losses["val_loss"]
    if not all(map(math.isfinite, losses.values())):
        stop_diverged(f"non-finite losses at the evaluation of iteration {iter_num} (train "
                      f"{losses['train_loss']}, val {val_loss})", config, last_good)
    if first_val_loss is not None and val_loss > first_val_loss:
        print(f"warning: val loss {val_loss:.4f} at iteration {iter_num} is above the run's "
              f"first evaluation's, {first_val_loss:.4f}: try a lower --learning_rate",
              file=sys.stderr)
    diverging = last_good is not None and val_loss >= best_val_loss + DIVERGED_NATS
    if diverging:
        print(f"warning: not saving {config['out_dir']}/ckpt.pt: val loss {val_loss:.4f} is far "
              f"above the best; it keeps iteration {last_good}", file=sys.stderr)
    return diverging


def check_state(state, config, last_good):
    """Stops, writing nothing, at a NaN or an infinity in a state to save; a finite state costs
    one read per device."""
    named = [(name, t) for name, t in checkpoint.named_tensors(state) if t.is_floating_point()]
    finite = {}  # by device: AdamW's step counts stay on the CPU
    for _, t in named:
        finite.setdefault(t.device, []).append(torch.isfinite(t).all())
    if not all(torch.stack(flags).all().item() for flags in finite.values()):
        bad = next(name for name, t in named if not torch.isfinite(t).all())
        stop_diverged(f"iteration {state['iter_num']}: non-finite values in {bad}", config,
                      last_good)


def check_data_unchanged(config, stamps):
    """Stops when the data's sizes or times changed since it was hashed."""
    if data.stamps(config["data_dir"]) != stamps:
        raise UserError(f"the data in {config['data_dir']} changed during the run: stopped "
                        "without saving — resume on the first data, or with --new_data=True")


def stop_requested(stop, ddp, device):
    """The stop signal any process got, agreed by all."""
    if not ddp:
        return stop.signum
    flag = torch.tensor([stop.signum or 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() or None


def stopped(signum, iter_num, config, last_good, master):
    """The cli.Stopped to raise once saved: what ckpt.pt holds, and how to go on."""
    note = (f"stopped by {signal.Signals(signum).name} after iteration {iter_num}: "
            f"{config['out_dir']}/ckpt.pt holds iteration {last_good}; continue with the same "
            "command and --init_from=resume")
    return cli.Stopped(signum, note if master else "")  # rank 0 speaks for all
